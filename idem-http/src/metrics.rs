//! The HTTP layer's metric: protected responses by status class.
//!
//! `idem_http_responses_total` counts every response of a protected
//! request (one that carried a key and reached the exchange), labelled
//! `store` and `namespace` as idem-core's metrics are, `class` (`2xx`,
//! `3xx`, `4xx`, `5xx`, or `other`) and `replayed` (`true` for a recorded
//! response sent again). A handler that fails with its own error is not
//! counted: the adapter answers it. Never labelled by key.

use http::{Response, StatusCode};
use idem_core::Idempotent;

use crate::{Reply, REPLAYED};

/// Counts one reply of [`Options::exchange`](crate::Options::exchange).
pub(crate) fn count<B, E>(idem: &Idempotent, reply: &Result<Reply<B>, E>) {
    let (status, replayed) = match reply {
        Ok(Reply::Whole(response)) => (response.status(), is_replay(response)),
        Ok(Reply::Handler(response)) => (response.status(), false),
        Ok(Reply::Streamed(response, recording)) => (response.status(), recording.is_none()),
        Err(_) => return,
    };
    metrics::counter!(
        "idem_http_responses_total",
        "store" => idem.store_name().to_owned(),
        "namespace" => idem.namespace().to_owned(),
        "class" => class(status),
        "replayed" => if replayed { "true" } else { "false" },
    )
    .increment(1);
}

fn is_replay<B>(response: &Response<B>) -> bool {
    response.headers().contains_key(REPLAYED)
}

/// `2xx` and its kin.
pub(crate) fn class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}
