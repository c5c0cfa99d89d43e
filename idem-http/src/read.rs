//! Reading a request body whole, up to a limit, as every adapter must
//! before it can fingerprint the request.

use std::fmt;
use std::future::poll_fn;
use std::pin::pin;

use bytes::{Bytes, BytesMut};
use http_body::Body;

use crate::BoxError;

/// Why [`read_body`] has no body to give.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadBodyError {
    /// The body holds more than the limit (its declared size, or what was
    /// read of it).
    TooLarge,
    /// The body failed while it was read.
    Failed(BoxError),
}

impl fmt::Display for ReadBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadBodyError::TooLarge => f.write_str("the body is over the limit"),
            ReadBodyError::Failed(error) => write!(f, "the body could not be read: {error}"),
        }
    }
}

impl std::error::Error for ReadBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadBodyError::TooLarge => None,
            ReadBodyError::Failed(error) => Some(&**error),
        }
    }
}

/// Reads `body` whole unless it holds more than `limit` bytes; trailers are
/// skipped. A body whose size hint is already over the limit is refused
/// before a byte is read.
///
/// A body that arrives in one data frame, as a small request does, is
/// handed back as that frame without a copy; only a body in several
/// frames is joined into one buffer.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ReadBodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if body.size_hint().lower() > limit_u64 {
        return Err(ReadBodyError::TooLarge);
    }
    let mut body = pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut read = 0usize;
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|error| ReadBodyError::Failed(error.into()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        read = read.saturating_add(data.len());
        if read > limit {
            return Err(ReadBodyError::TooLarge);
        }
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut both = BytesMut::with_capacity(read);
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
    }
    Ok(match joined {
        Some(joined) => joined.freeze(),
        None => first,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http::HeaderMap;
    use http_body::{Frame, SizeHint};

    use super::*;

    /// A body of given frames, with an error at the end when asked, and a
    /// declared size.
    struct Frames {
        frames: VecDeque<Frame<Bytes>>,
        fail: bool,
        declared: Option<u64>,
    }

    impl Frames {
        fn of(parts: &[&'static [u8]]) -> Frames {
            Frames {
                frames: parts
                    .iter()
                    .map(|part| Frame::data(Bytes::from_static(part)))
                    .collect(),
                fail: false,
                declared: None,
            }
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            match self.frames.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None if self.fail => {
                    self.fail = false;
                    Poll::Ready(Some(Err("reset".into())))
                }
                None => Poll::Ready(None),
            }
        }

        fn size_hint(&self) -> SizeHint {
            self.declared
                .map_or_else(SizeHint::default, SizeHint::with_exact)
        }
    }

    #[tokio::test]
    async fn one_frame_is_handed_back_as_it_came() {
        let body = Frames::of(&[b"{\"a\":1}"]);
        let read = read_body(body, 100).await.unwrap();
        assert_eq!(read, Bytes::from_static(b"{\"a\":1}"));
        // The same memory: no copy was made.
        assert_eq!(read.as_ptr(), b"{\"a\":1}".as_ptr());
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_skipped() {
        let mut body = Frames::of(&[b"", b"ab", b"", b"c", b"def"]);
        body.frames.push_back(Frame::trailers(HeaderMap::new()));
        assert_eq!(read_body(body, 6).await.unwrap(), "abcdef");
        assert_eq!(read_body(Frames::of(&[]), 0).await.unwrap(), "");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        let read = read_body(Frames::of(&[b"abc", b"defg"]), 6).await;
        assert!(matches!(read, Err(ReadBodyError::TooLarge)), "{read:?}");
        let read = read_body(Frames::of(&[b"abcdefg"]), 6).await;
        assert!(matches!(read, Err(ReadBodyError::TooLarge)), "{read:?}");
        // Declared over the limit: refused before any frame is read.
        let mut declared = Frames::of(&[b"a"]);
        declared.declared = Some(7);
        let read = read_body(declared, 6).await;
        assert!(matches!(read, Err(ReadBodyError::TooLarge)), "{read:?}");
    }

    #[tokio::test]
    async fn a_failing_body_says_so() {
        let mut body = Frames::of(&[b"ab"]);
        body.fail = true;
        let read = read_body(body, 100).await;
        assert!(
            matches!(&read, Err(ReadBodyError::Failed(error)) if error.to_string() == "reset"),
            "{read:?}"
        );
    }
}
