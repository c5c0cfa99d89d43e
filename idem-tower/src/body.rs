//! The body types the middleware hands to the wrapped service and back to
//! the server.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use idem_http::Collected;

/// The error type bodies are boxed with.
pub type BoxError = idem_http::BoxError;

/// Declares a boxed body newtype: one per direction, so that neither type
/// names the boxed error in a generic position (which trips rustc's
/// higher-ranked `Send` checks when the future is spawned).
macro_rules! boxed_body {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(UnsyncBoxBody<Bytes, BoxError>);

        impl $name {
            pub(crate) fn new<B>(body: B) -> $name
            where
                B: Body<Data = Bytes> + Send + 'static,
                B::Error: Into<BoxError>,
            {
                $name(body.map_err(Into::into).boxed_unsync())
            }

            pub(crate) fn full(bytes: Bytes) -> $name {
                $name::new(Full::new(bytes))
            }
        }

        impl Body for $name {
            type Data = Bytes;
            type Error = BoxError;

            fn poll_frame(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
                Pin::new(&mut self.0).poll_frame(cx)
            }

            fn is_end_stream(&self) -> bool {
                self.0.is_end_stream()
            }

            fn size_hint(&self) -> SizeHint {
                self.0.size_hint()
            }
        }
    };
}

boxed_body! {
    /// The body the wrapped service receives: the request's own body when it
    /// passes through, or the bytes already read when the request is
    /// protected. Any service taking `Request<B>` for `B: Body<Data = Bytes>`
    /// accepts it, axum's `Router` among them.
    RequestBody
}

boxed_body! {
    /// The body every response has: the handler's own body, a recorded body,
    /// or a problem document. It is `Send` and `'static`, so axum turns it into
    /// a response and hyper serves it as it is.
    ResponseBody
}

/// Bytes already read, then the rest of the body they came from.
struct Prefixed {
    prefix: Option<Bytes>,
    rest: ResponseBody,
}

impl Prefixed {
    fn new(prefix: Bytes, rest: ResponseBody) -> Prefixed {
        Prefixed {
            prefix: Some(prefix),
            rest,
        }
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        hint.set_lower(hint.lower() + extra);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + extra);
        }
        hint
    }
}

impl ResponseBody {
    /// The body of a response that streams through idem-http's frames.
    pub(crate) fn frames(frames: idem_http::Frames) -> ResponseBody {
        ResponseBody::new(FramesBody(frames))
    }
}

/// idem-http's frames as a body.
struct FramesBody(idem_http::Frames);

impl Body for FramesBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        futures_core::Stream::poll_next(Pin::new(&mut self.0), cx)
            .map(|frame| frame.map(|data| data.map(Frame::data)))
    }
}

impl idem_http::ResponseBody for ResponseBody {
    const STREAMS: bool = true;

    fn exact_len(&self) -> Option<u64> {
        self.size_hint().exact()
    }

    async fn frame(&mut self) -> Option<Result<Bytes, BoxError>> {
        loop {
            match BodyExt::frame(self).await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
                Err(error) => return Some(Err(error)),
            }
        }
    }

    async fn collect(mut self, limit: usize) -> Collected<Self> {
        let mut read = BytesMut::new();
        if self.size_hint().lower() > limit as u64 {
            return Collected::TooLarge(self);
        }
        while let Some(frame) = BodyExt::frame(&mut self).await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                        if read.len() > limit {
                            let prefix = read.freeze();
                            return Collected::TooLarge(ResponseBody::new(Prefixed::new(
                                prefix, self,
                            )));
                        }
                    }
                }
                Err(error) => return Collected::Failed(error),
            }
        }
        Collected::Whole(read.freeze())
    }
}
