//! The handler's body, read up to a limit for idem-http.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;

use actix_web::body::{BodySize, BodyStream, BoxBody, MessageBody};
use bytes::{Bytes, BytesMut};
use idem_http::Collected;

/// An actix body handed through idem-http's exchange.
pub(crate) struct Body(pub(crate) BoxBody);

impl idem_http::ResponseBody for Body {
    const STREAMS: bool = true;

    fn exact_len(&self) -> Option<u64> {
        match self.0.size() {
            BodySize::Sized(len) => Some(len),
            _ => None,
        }
    }

    async fn frame(&mut self) -> Option<Result<Bytes, idem_http::BoxError>> {
        let next = poll_fn(|cx| Pin::new(&mut self.0).poll_next(cx)).await?;
        Some(next.map_err(|error| error.to_string().into()))
    }

    async fn collect(mut self, limit: usize) -> Collected<Self> {
        if matches!(self.0.size(), BodySize::Sized(len) if len > limit as u64) {
            return Collected::TooLarge(self);
        }
        let mut read = BytesMut::new();
        while let Some(chunk) = poll_fn(|cx| Pin::new(&mut self.0).poll_next(cx)).await {
            match chunk {
                Ok(data) => {
                    read.extend_from_slice(&data);
                    if read.len() > limit {
                        return Collected::TooLarge(prefixed(read.freeze(), self.0));
                    }
                }
                Err(error) => return Collected::Failed(error.to_string().into()),
            }
        }
        Collected::Whole(read.freeze())
    }
}

/// Bytes already read, then the rest of the body they came from.
fn prefixed(prefix: Bytes, mut rest: BoxBody) -> Body {
    let rest = futures_util::stream::poll_fn(move |cx| {
        Pin::new(&mut rest)
            .poll_next(cx)
            .map(|chunk| chunk.map(|c| c.map_err(|e| io::Error::other(e.to_string()))))
    });
    let first = futures_util::stream::once(async move { Ok::<_, io::Error>(prefix) });
    Body(BoxBody::new(BodyStream::new(
        futures_util::StreamExt::chain(first, rest),
    )))
}
