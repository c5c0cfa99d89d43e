//! The exchange without a handler, for a binding whose application runs
//! outside Rust (Python's ASGI, Node's `http`): the binding asks what to do
//! with a request, runs the application when told to, and hands its
//! response back frame by frame. Every decision stays here: the key, the
//! fingerprint, the scope, the statuses and problem bodies, waiting, the
//! stored format and its chunks, metrics and spans. The binding moves
//! bytes.
//!
//! ```
//! use bytes::Bytes;
//! use http::{HeaderMap, Method, StatusCode, Uri};
//! use idem_core::MemoryStore;
//! use idem_http::{Options, Start};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let options = Options::new(MemoryStore::new());
//! let mut headers = HeaderMap::new();
//! headers.insert("idempotency-key", "order-7f3a".parse().unwrap());
//! let uri: Uri = "/payments".parse().unwrap();
//! let body = Bytes::from_static(b"{}");
//! let mut statuses = Vec::new();
//! for _ in 0..2 {
//!     let answer = match options.start(&Method::POST, &uri, &headers, body.clone(), None).await {
//!         Start::Run(run) => {
//!             // The application's response, as it would send it.
//!             run.respond(StatusCode::CREATED, HeaderMap::new()).unwrap();
//!             run.send(Bytes::from_static(b"charged")).await.unwrap();
//!             run.end();
//!             run.answer().await.unwrap()
//!         }
//!         Start::Answer(answer) => answer,
//!         _ => unreachable!("a POST with a key is protected"),
//!     };
//!     statuses.push((answer.status, answer.body.next().await.unwrap().unwrap()));
//! }
//! assert_eq!(statuses[0], statuses[1]);
//! # }
//! ```
//!
//! Choices:
//!
//! * The exchange runs in a task of its own on the caller's tokio runtime.
//!   A binding whose request is cancelled cannot cancel the claim or the
//!   recording.
//! * [`Run::answer`] is what the client gets: the response as sent when it
//!   was recorded whole, a 500 problem when its body failed, its frames
//!   when it streams. So the binding awaits it while the application
//!   sends, not after: a streamed body waits for its reader.
//! * A [`Run`] dropped, or aborted, before [`Run::respond`] releases the
//!   key, as a Rust handler's error does. A binding must therefore keep
//!   the application running when its own request is cancelled.
//! * Bodies are read by the binding up to [`Options::max_request_body`]
//!   plus one byte; a longer body is refused here with 413.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use tokio::sync::{mpsc, oneshot};

use crate::exchange::{BoxError, ResponseBody};
use crate::{Admission, Collected, Frames, Options, Problem, Reply};

/// Frames a binding may send ahead of the exchange reading them.
const QUEUED_FRAMES: usize = 16;

/// What to do with a request, from [`Options::start`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Start {
    /// Not protected: hand it to the application untouched.
    Pass,
    /// Answer with this: a replay, a problem, or a response followed while
    /// it streams. The application does not run.
    Answer(Answer),
    /// Run the application once, and report its response to the [`Run`].
    Run(Run),
}

/// A response for the binding to send.
#[derive(Debug)]
#[non_exhaustive]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers, `Idempotent-Replayed` on a replay.
    pub headers: HeaderMap,
    /// Its body.
    pub body: AnswerBody,
}

impl Answer {
    fn of<B>(response: Response<B>, body: impl FnOnce(B) -> AnswerBody) -> Answer {
        let (parts, inner) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body(inner),
        }
    }

    fn problem(problem: Problem) -> Answer {
        Answer::of(problem.into_response(), AnswerBody::bytes)
    }

    fn from_reply(reply: Reply<Channel>) -> Answer {
        match reply {
            Reply::Whole(response) => Answer::of(response, AnswerBody::bytes),
            Reply::Handler(response) => {
                Answer::of(response, |body| AnswerBody::new(Source::Channel(body)))
            }
            Reply::Streamed(response, recording) => {
                if let Some(recording) = recording {
                    // It outlives the request: a client that hangs up does
                    // not stop the recording.
                    drop(tokio::spawn(recording.run()));
                }
                Answer::of(response, |body| AnswerBody::new(Source::Frames(body)))
            }
        }
    }
}

/// The body of an [`Answer`]: bytes in memory, or frames as they come.
/// Clones read the same body.
#[derive(Clone)]
pub struct AnswerBody {
    whole: Option<Bytes>,
    source: Arc<tokio::sync::Mutex<Source>>,
}

enum Source {
    Whole(Option<Bytes>),
    Channel(Channel),
    Frames(Frames),
}

impl fmt::Debug for AnswerBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnswerBody")
            .field("whole", &self.whole.as_ref().map(Bytes::len))
            .finish_non_exhaustive()
    }
}

impl AnswerBody {
    fn new(source: Source) -> AnswerBody {
        AnswerBody {
            whole: None,
            source: Arc::new(tokio::sync::Mutex::new(source)),
        }
    }

    fn bytes(body: Bytes) -> AnswerBody {
        AnswerBody {
            whole: Some(body.clone()),
            source: Arc::new(tokio::sync::Mutex::new(Source::Whole(Some(body)))),
        }
    }

    /// The whole body when it is in memory (a replay or a problem, or a
    /// response recorded whole), so a binding can send it in one piece;
    /// `None` when it streams, to be read with [`next`](Self::next).
    pub fn whole(&self) -> Option<Bytes> {
        self.whole.clone()
    }

    /// The body's next frame, or `None` at its end. An error ends the body
    /// early: the binding cuts the response short, so the client never
    /// sees a clean end without all of its bytes.
    pub fn next(&self) -> impl Future<Output = Option<Result<Bytes, BoxError>>> + Send + 'static {
        let source = Arc::clone(&self.source);
        async move {
            let mut source = source.lock().await;
            match &mut *source {
                Source::Whole(body) => body.take().map(Ok),
                Source::Channel(channel) => channel.frame().await,
                Source::Frames(frames) => frames.next().await,
            }
        }
    }
}

/// The error of a [`Run`] step taken out of turn: after the exchange has
/// moved past it, or after the run was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandoffError {
    /// The step was already taken, or the exchange no longer reads it (a
    /// body that failed, a client's answer already decided).
    Finished,
    /// The run was aborted, or its response head never came: the key is
    /// released and there is nothing to send but the binding's own error.
    Aborted,
}

impl fmt::Display for HandoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandoffError::Finished => "the idempotent exchange is past this step",
            HandoffError::Aborted => "the idempotent exchange was aborted; the key is released",
        })
    }
}

impl std::error::Error for HandoffError {}

/// An application run the exchange waits for: its response head with
/// [`respond`](Self::respond), its body with [`send`](Self::send) and
/// [`end`](Self::end) (or [`fail`](Self::fail)), and what the client gets
/// with [`answer`](Self::answer). Clones drive the same run.
#[derive(Clone)]
pub struct Run(Arc<RunParts>);

struct RunParts {
    head: Mutex<Option<oneshot::Sender<(StatusCode, HeaderMap)>>>,
    frames: Mutex<Option<mpsc::Sender<Result<Bytes, BoxError>>>>,
    answer: Mutex<Option<oneshot::Receiver<Answer>>>,
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").finish_non_exhaustive()
    }
}

/// Takes what a mutex holds; a panic elsewhere leaves it usable.
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

impl Run {
    /// The application's status and headers, once.
    pub fn respond(&self, status: StatusCode, headers: HeaderMap) -> Result<(), HandoffError> {
        let head = take(&self.0.head).ok_or(HandoffError::Finished)?;
        head.send((status, headers))
            .map_err(|_| HandoffError::Finished)
    }

    /// One frame of the body. It waits while the exchange has
    /// 16 frames unread; `Finished` says the exchange reads no more
    /// (the binding stops sending).
    pub fn send(
        &self,
        frame: Bytes,
    ) -> impl Future<Output = Result<(), HandoffError>> + Send + 'static {
        let sender = self
            .0
            .frames
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        async move {
            let sender = sender.ok_or(HandoffError::Finished)?;
            if frame.is_empty() {
                return Ok(());
            }
            sender
                .send(Ok(frame))
                .await
                .map_err(|_| HandoffError::Finished)
        }
    }

    /// The body's end.
    pub fn end(&self) {
        drop(take(&self.0.frames));
    }

    /// The body failed after its head was sent: the client's response is
    /// cut short and the key is marked executed without a replayable
    /// response, as for a Rust handler's body that fails.
    pub fn fail(&self, error: impl Into<BoxError>) {
        if let Some(sender) = take(&self.0.frames) {
            // A full queue is drained by the exchange; waiting here would
            // block the binding, so the error goes in a task.
            let error = error.into();
            drop(tokio::spawn(async move {
                let _ = sender.send(Err(error)).await;
            }));
        }
    }

    /// The application failed before its response head: the key is
    /// released, and the binding answers with its own error.
    pub fn abort(&self) {
        drop(take(&self.0.head));
        drop(take(&self.0.frames));
    }

    /// What the client gets, once the exchange knows: awaited while the
    /// application sends its body.
    pub fn answer(&self) -> impl Future<Output = Result<Answer, HandoffError>> + Send + 'static {
        let answer = take(&self.0.answer);
        async move {
            let answer = answer.ok_or(HandoffError::Finished)?;
            answer.await.map_err(|_| HandoffError::Aborted)
        }
    }
}

/// The application's body as the exchange reads it: the frames the binding
/// sends, with those already read for the whole-record limit in front.
struct Channel {
    read: VecDeque<Bytes>,
    frames: mpsc::Receiver<Result<Bytes, BoxError>>,
}

impl ResponseBody for Channel {
    const STREAMS: bool = true;

    async fn collect(mut self, limit: usize) -> Collected<Self> {
        let mut len = 0;
        loop {
            match self.frames.recv().await {
                None => break,
                Some(Err(error)) => return Collected::Failed(error),
                Some(Ok(frame)) => {
                    len += frame.len();
                    self.read.push_back(frame);
                    if len > limit {
                        return Collected::TooLarge(self);
                    }
                }
            }
        }
        let mut whole = BytesMut::with_capacity(len);
        for frame in self.read {
            whole.extend_from_slice(&frame);
        }
        Collected::Whole(whole.freeze())
    }

    // Cancel-safe: a frame already read is taken before any wait, and the
    // channel loses nothing to a dropped `recv`.
    async fn frame(&mut self) -> Option<Result<Bytes, BoxError>> {
        if let Some(frame) = self.read.pop_front() {
            return Some(Ok(frame));
        }
        self.frames.recv().await
    }
}

/// The error a run's handler ends with when the binding aborts it.
#[derive(Debug)]
struct Aborted;

impl Options {
    /// Decides what to do with a request whose application runs outside
    /// Rust (see [`handoff`](crate::handoff)); `body` is what the binding
    /// read of it, within [`max_request_body`](Options::max_request_body)
    /// plus one byte. A binding calls [`admit`](Options::admit) first and
    /// reads no body when it says [`Admission::Pass`].
    ///
    /// `scope` is the application's own (its authenticated principal);
    /// `None` scopes the key by the request's caller, as
    /// [`request_context`](Options::request_context) reads it.
    ///
    /// It needs a tokio runtime: the exchange runs in a task of its own.
    pub async fn start(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        scope: Option<String>,
    ) -> Start {
        let key = match self.admit(method, headers) {
            Admission::Pass => return Start::Pass,
            Admission::Refuse(problem) => return Start::Answer(Answer::problem(problem)),
            Admission::Protect(key) => Some(key),
            Admission::KeyInBody => None,
        };
        if body.len() > self.max_request_body {
            let problem = Problem::BodyTooLarge(self.max_request_body);
            return Start::Answer(Answer::problem(problem));
        }
        let key = match key {
            Some(key) => key,
            None => match self.admit_body(method, uri, headers, &body) {
                Admission::Protect(key) => key,
                Admission::Refuse(problem) => return Start::Answer(Answer::problem(problem)),
                _ => return Start::Pass,
            },
        };
        let idem = match scope {
            Some(scope) => self.idempotent().scoped(scope),
            None => self.idempotent().clone(),
        };
        let fingerprint = self.fingerprint(method, uri, headers, &body);
        let context = self.request_context(headers);
        let (head_sender, head) = oneshot::channel();
        let (frames_sender, frames) = mpsc::channel(QUEUED_FRAMES);
        let (started_sender, started) = oneshot::channel();
        let (answer_sender, answer) = oneshot::channel();
        let options = self.clone();
        drop(tokio::spawn(async move {
            let reply = options
                .exchange_with(&idem, &key, fingerprint, context, || async move {
                    // The binding learns it runs the application, then the
                    // exchange waits for the application's response.
                    let _ = started_sender.send(());
                    let (status, headers) = head.await.map_err(|_| Aborted)?;
                    let channel = Channel {
                        read: VecDeque::new(),
                        frames,
                    };
                    let mut response = Response::new(channel);
                    *response.status_mut() = status;
                    *response.headers_mut() = headers;
                    Ok::<_, Aborted>(response)
                })
                .await;
            if let Ok(reply) = reply {
                let _ = answer_sender.send(Answer::from_reply(reply));
            }
        }));
        if started.await.is_ok() {
            return Start::Run(Run(Arc::new(RunParts {
                head: Mutex::new(Some(head_sender)),
                frames: Mutex::new(Some(frames_sender)),
                answer: Mutex::new(Some(answer)),
            })));
        }
        match answer.await {
            Ok(answer) => Start::Answer(answer),
            // The exchange's task ended with neither: only a panic does.
            Err(_) => Start::Answer(Answer::problem(Problem::Internal(
                "the idempotency check failed",
            ))),
        }
    }
}
