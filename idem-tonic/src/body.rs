//! The response body the server layer answers with: the handler's own, or
//! a message and trailers in memory (a recorded answer or a replay).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// The error a body fails with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of an answer from [`IdempotencyService`](crate::IdempotencyService):
/// the handler's body, streamed as it comes, or a message and its trailers
/// held in memory.
pub struct ReplyBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    Inner(Pin<Box<B>>),
    Whole {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    /// What was read of a body over the limit, then the rest of it.
    Prefixed {
        prefix: Option<Bytes>,
        rest: Pin<Box<B>>,
    },
}

impl<B> ReplyBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ReplyBody {
            kind: Kind::Inner(Box::pin(body)),
        }
    }

    pub(crate) fn whole(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ReplyBody {
            kind: Kind::Whole {
                data: (!data.is_empty()).then_some(data),
                trailers: trailers.filter(|trailers| !trailers.is_empty()),
            },
        }
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        ReplyBody {
            kind: Kind::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }
}

impl<B> Default for ReplyBody<B> {
    /// An empty body: what a trailers-only answer carries.
    fn default() -> Self {
        ReplyBody::whole(Bytes::new(), None)
    }
}

impl<B> fmt::Debug for ReplyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner(_) => "Inner",
            Kind::Whole { .. } => "Whole",
            Kind::Prefixed { .. } => "Prefixed",
        };
        f.debug_tuple("ReplyBody").field(&kind).finish()
    }
}

impl<B> Body for ReplyBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every field is boxed or `Unpin`, so the body is `Unpin`.
        match &mut self.get_mut().kind {
            Kind::Inner(body) => body
                .as_mut()
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(Into::into))),
            Kind::Whole { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(
                    trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                )
            }
            Kind::Prefixed { prefix, rest } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                rest.as_mut()
                    .poll_frame(cx)
                    .map(|frame| frame.map(|frame| frame.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner(body) => body.is_end_stream(),
            Kind::Whole { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner(body) => body.size_hint(),
            Kind::Whole { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
            Kind::Prefixed { prefix, rest } => {
                let before = prefix.as_ref().map_or(0, |prefix| prefix.len() as u64);
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower().saturating_add(before));
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper.saturating_add(before));
                }
                sum
            }
        }
    }
}

/// A handler's response body, read up to a limit.
pub(crate) enum Collected<B> {
    /// The whole message and the trailers.
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Over the limit: what was read, and the rest.
    TooLarge { prefix: Bytes, rest: B },
    /// The body failed while it was read.
    Failed(BoxError),
}

/// Reads `body` whole, data and trailers, unless its data is over `limit`.
pub(crate) async fn collect<B>(mut body: B, limit: usize) -> Collected<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;

    let mut data = bytes::BytesMut::new();
    let mut first: Option<Bytes> = None;
    let mut trailers: Option<HeaderMap> = None;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Err(error)) => return Collected::Failed(error.into()),
            Some(Ok(frame)) => frame,
        };
        let frame = match frame.into_data() {
            Ok(chunk) => {
                let held = first.as_ref().map_or(0, Bytes::len) + data.len();
                if held + chunk.len() > limit {
                    let mut prefix = bytes::BytesMut::new();
                    if let Some(first) = first {
                        prefix.extend_from_slice(&first);
                    }
                    prefix.extend_from_slice(&data);
                    prefix.extend_from_slice(&chunk);
                    return Collected::TooLarge {
                        prefix: prefix.freeze(),
                        rest: body,
                    };
                }
                // A unary answer is most often one chunk: keep it without
                // a copy.
                match &first {
                    None if data.is_empty() => first = Some(chunk),
                    _ => {
                        if let Some(first) = first.take() {
                            data.extend_from_slice(&first);
                        }
                        data.extend_from_slice(&chunk);
                    }
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(map) = frame.into_trailers() {
            match &mut trailers {
                Some(trailers) => trailers.extend(map),
                None => trailers = Some(map),
            }
        }
    }
    let data = first.unwrap_or_else(|| data.freeze());
    Collected::Whole { data, trailers }
}
