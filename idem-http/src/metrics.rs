//! The HTTP layer's metric: protected responses by status class.
//!
//! `idem_http_responses_total` counts every response of a protected
//! request (one that carried a key and reached the exchange), labelled
//! `store` and `namespace` as idem-core's metrics are, `class` (`2xx`,
//! `3xx`, `4xx`, `5xx`, or `other`) and `replayed` (`true` for a recorded
//! response sent again). A handler that fails with its own error is not
//! counted: the adapter answers it. Never labelled by key.

use std::sync::Arc;

use http::{Response, StatusCode};
use idem_core::Idempotent;
use metrics::{Key, Label, Level, Metadata};

use crate::{Reply, REPLAYED};

const NAME: &str = "idem_http_responses_total";

const CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "other"];

/// What the `metrics` macros attach to every metric they register.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The counter's keys for one store and namespace, every class and
/// replayed flag, built with the options: each response then only asks the
/// recorder current at that moment for its counter, as the macros do,
/// without building a label vector and hashing it again.
#[derive(Debug)]
pub(crate) struct ResponseKeys {
    store: String,
    namespace: String,
    keys: Vec<Key>,
}

impl ResponseKeys {
    pub(crate) fn new(idem: &Idempotent) -> Arc<ResponseKeys> {
        let (store, namespace) = (idem.store_name(), idem.namespace());
        let keys = CLASSES
            .iter()
            .flat_map(|class| {
                ["false", "true"].map(|replayed| {
                    let labels = vec![
                        Label::new("store", store.to_owned()),
                        Label::new("namespace", namespace.to_owned()),
                        Label::new("class", *class),
                        Label::new("replayed", replayed),
                    ];
                    Key::from_parts(NAME, labels)
                })
            })
            .collect();
        Arc::new(ResponseKeys {
            store: store.to_owned(),
            namespace: namespace.to_owned(),
            keys,
        })
    }
}

/// Counts one reply of [`Options::exchange`](crate::Options::exchange).
pub(crate) fn count<B, E>(keys: &ResponseKeys, idem: &Idempotent, reply: &Result<Reply<B>, E>) {
    let (status, replayed) = match reply {
        Ok(Reply::Whole(response)) => (response.status(), is_replay(response)),
        Ok(Reply::Handler(response)) => (response.status(), false),
        Ok(Reply::Streamed(response, recording)) => (response.status(), recording.is_none()),
        Err(_) => return,
    };
    let class = class(status);
    // The exchange's handle is the options' own, or a scope of it, with
    // the same store and namespace; another is counted the long way.
    if idem.store_name() == keys.store && idem.namespace() == keys.namespace {
        let at = match status.as_u16() / 100 {
            class @ 2..=5 => usize::from(class - 2),
            _ => 4,
        } * 2;
        if let Some(key) = keys.keys.get(at + usize::from(replayed)) {
            metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                .increment(1);
            return;
        }
    }
    metrics::counter!(
        NAME,
        "store" => idem.store_name().to_owned(),
        "namespace" => idem.namespace().to_owned(),
        "class" => class,
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
