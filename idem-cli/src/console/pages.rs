//! The console's pages, rendered with maud (which escapes every value).

use std::fmt::Write;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_core::inspect::{page_limit, KeyParts, Listed, Listing};
use idem_core::observe::key_hash;
use idem_core::store::{Record, Reset, State};
use idem_core::Key;
use idem_http::stored::{self, Stored};
use maud::{html, Markup, DOCTYPE};

use super::{param, Console, Params};
use crate::show;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left}\
code{word-break:break-all}nav a{margin-right:1em}.note{color:#555}";

/// A whole page.
pub(super) fn layout(store: Option<&str>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { (title) " · idem console" } style { (STYLE) } }
            body {
                nav {
                    a href="/keys?state=in-flight" { "In flight" }
                    a href="/keys?state=completed" { "Completed" }
                    a href="/keys?state=failed" { "Failed" }
                    a href="/inbox" { "Inbox" }
                    a href="/rates" { "Rates" }
                    @if let Some(store) = store { span.note { "store " code { (store) } } }
                }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// A page with a status and no store in its header.
pub(super) fn message(status: StatusCode, title: &str, body: Markup) -> Response {
    (status, layout(None, title, body)).into_response()
}

/// A page of this console with a status.
pub(super) fn page(console: &Console, status: StatusCode, title: &str, body: Markup) -> Response {
    (status, layout(Some(&console.store_name), title, body)).into_response()
}

/// Percent-encodes a query parameter's value.
pub(super) fn enc(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A link's query naming one key.
fn key_query(namespace: &str, scope: &str, key: &str) -> String {
    format!(
        "namespace={}&scope={}&key={}",
        enc(namespace),
        enc(scope),
        enc(key)
    )
}

/// The form that looks a key up by its client key.
fn lookup(namespace: &str) -> Markup {
    html! {
        form method="get" action="/key" {
            "Look up a key: "
            label { "namespace " input name="namespace" value=(namespace); }
            " " label { "scope " input name="scope"; }
            " " label { "client key " input name="key" required; }
            " " button { "Look up" }
        }
    }
}

/// Records by state, newest first, a page at a time.
pub(super) async fn keys(console: &Console, params: &Params) -> Response {
    let state = match param(params, "state") {
        "failed" => "failed",
        "completed" => "completed",
        _ => "in-flight",
    };
    let namespace = param(params, "namespace");
    let scope = param(params, "scope");
    let after = params
        .get("after")
        .map(String::as_str)
        .filter(|a| !a.is_empty());
    let limit = page_limit(param(params, "limit").parse().unwrap_or(50));
    let stats = console.store.stats().await;
    let listing = match state {
        "failed" => Some(Listing::Failed),
        "in-flight" => Some(Listing::InFlight),
        _ => None,
    };
    let listed = match listing {
        Some(listing) => Some(console.store.list(listing, after, limit).await),
        None => None,
    };
    let body = html! {
        @match &stats {
            Ok(stats) => p {
                "In flight " strong { (stats.in_flight) } ", lapsed " strong { (stats.lapsed) }
                ", completed " strong { (stats.completed) } ", failed " strong { (stats.failed) }
                ", expired awaiting purge " strong { (stats.expired) } "."
            },
            Err(error) => p { "This store cannot count its records: " (error.to_string()) },
        }
        (lookup(namespace))
        form method="get" action="/keys" {
            input type="hidden" name="state" value=(state);
            label { "namespace " input name="namespace" value=(namespace); }
            " " label { "scope " input name="scope" value=(scope); }
            " " button { "Filter" }
        }
        @match &listed {
            None => p {
                "This store lists records in flight and failed ones only; \
                 look a completed key up by its client key above."
            },
            Some(Err(error)) => p { "This store cannot list its records: " (error.to_string()) },
            Some(Ok(page)) => {
                (table(page_rows(&page.records, namespace, scope)))
                p.note {
                    "Newest first within a page (most retention left). The namespace \
                     and scope filters apply to each page, so a page may show fewer rows."
                }
                @if let Some(next) = &page.next {
                    a href={ "/keys?state=" (state) "&namespace=" (enc(namespace)) "&scope=" (enc(scope)) "&after=" (enc(next)) } { "Next page" }
                } @else {
                    p { "No more pages." }
                }
            }
        }
    };
    let title = match state {
        "failed" => "Failed keys",
        "completed" => "Completed keys",
        _ => "Keys in flight",
    };
    page(console, StatusCode::OK, title, body)
}

/// The page's records in the namespace and scope asked (any when a filter
/// is empty), newest first.
fn page_rows<'a>(
    records: &'a [Listed],
    namespace: &str,
    scope: &str,
) -> Vec<(Option<KeyParts>, &'a Listed)> {
    let mut rows: Vec<_> = records
        .iter()
        .map(|listed| (KeyParts::parse(&listed.key), listed))
        .filter(|(parts, _)| {
            (namespace.is_empty() || parts.as_ref().is_some_and(|p| p.namespace == namespace))
                && (scope.is_empty() || parts.as_ref().is_some_and(|p| p.scope == scope))
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1.record.retention_remaining));
    rows
}

fn table(rows: Vec<(Option<KeyParts>, &Listed)>) -> Markup {
    html! {
        table {
            tr { th { "client key" } th { "namespace" } th { "scope" } th { "state" } th { "lease left" } th { "retention left" } th { "bytes" } }
            @for (parts, listed) in &rows {
                tr {
                    @if let Some(parts) = parts {
                        td { a href={ "/key?" (key_query(&parts.namespace, &parts.scope, &parts.client_key)) } { code { (show::preview(parts.client_key.as_bytes())) } } }
                        td { (parts.namespace) } td { (parts.scope) }
                    } @else {
                        td { code { (show::preview(listed.key.as_bytes())) } " (not an idem key)" } td {} td {}
                    }
                    td { (show::state(&listed.record)) }
                    td { (lease(&listed.record)) }
                    td { (show::duration(listed.record.retention_remaining)) }
                    td { (listed.record.payload.len()) }
                }
            }
        }
        @if rows.is_empty() { p { "No records on this page." } }
    }
}

fn lease(record: &Record) -> String {
    match (record.state, record.lease_remaining) {
        (State::InFlight, Some(left)) if !left.is_zero() => show::duration(left),
        (State::InFlight, _) => "lapsed".to_owned(),
        _ => "—".to_owned(),
    }
}

/// The key a request names, encoded as the store encodes it.
fn named_key(params: &Params) -> Result<Key, String> {
    Key::new(
        param(params, "namespace"),
        param(params, "scope"),
        param(params, "key"),
    )
    .map_err(|e| e.to_string())
}

/// One key's record.
pub(super) async fn record(console: &Console, params: &Params) -> Response {
    let (namespace, scope, client) = (
        param(params, "namespace"),
        param(params, "scope"),
        param(params, "key"),
    );
    let key = match named_key(params) {
        Ok(key) => key,
        Err(error) => {
            let body = html! { p { "Not a key: " (error) } (lookup(namespace)) };
            return page(console, StatusCode::BAD_REQUEST, "Bad key", body);
        }
    };
    let record = match console.store.load(key.as_str()).await {
        Ok(record) => record,
        Err(error) => {
            let body = html! { p { "The store failed: " (error.to_string()) } };
            return page(console, StatusCode::BAD_GATEWAY, "Store error", body);
        }
    };
    let head = html! {
        tr { th { "key" } td { code { (show::key(key.as_str())) } } }
        tr { th { "hash" } td { code { (key_hash(key.as_str()).to_string()) } } }
    };
    let Some(record) = record else {
        let body = html! {
            table { (head) tr { th { "state" } td { "absent (no live record: never used, released, reset or expired)" } } }
            (lookup(namespace))
        };
        return page(console, StatusCode::NOT_FOUND, "No record", body);
    };
    let query = key_query(namespace, scope, client);
    let body = html! {
        table {
            (head)
            tr { th { "state" } td { (show::state(&record)) } }
            tr { th { "lease left" } td { (lease(&record)) } }
            tr { th { "retention left" } td { (show::duration(record.retention_remaining)) } }
            tr { th { "token" } td { code { (record.token.to_string()) } } }
            tr { th { "fingerprint" } td { "scheme " (record.fingerprint.scheme()) ", " code { (record.fingerprint.to_string()) } } }
            tr { th { "outcome" } td { (record.payload.len()) " bytes" } }
        }
        h2 { "Outcome" }
        (outcome(console, &record.payload))
        h2 { "Mend" }
        @match record.state {
            State::InFlight => p {
                a href={ "/confirm/release?" (query) "&token=" (record.token.to_string()) } { "Release this lease…" }
                " — for a worker known to be dead: the next request runs the work again."
            },
            _ => p {
                a href={ "/confirm/reset?" (query) } { "Reset this key…" }
                " — deletes the recorded outcome: the next request runs the work again."
            },
        }
    };
    page(console, StatusCode::OK, "Record", body)
}

/// The outcome, read as an HTTP record when it is one.
fn outcome(console: &Console, payload: &[u8]) -> Markup {
    let hidden =
        html! { span.note { "hidden (start the console with --show-payloads to see it)" } };
    let preview = |bytes: &[u8]| -> Markup {
        if console.show_payloads {
            html! { code.payload { (show::preview(bytes)) } }
        } else {
            hidden.clone()
        }
    };
    let headers = |headers: &idem_http::http::HeaderMap| -> Markup {
        html! {
            table {
                @for (name, value) in headers {
                    tr { th { (name.as_str()) } td { (preview(value.as_bytes())) } }
                }
            }
        }
    };
    if payload.is_empty() {
        return html! { p { "None stored." } };
    }
    match stored::decode(payload) {
        Ok(Stored::Response {
            status,
            headers: stored_headers,
            body,
            ..
        }) => html! {
            p { "An HTTP response: status " strong { (status.as_str()) } ", body " (body.len()) " bytes." }
            (headers(&stored_headers))
            p { "Body: " (preview(&body)) }
        },
        Ok(Stored::Streamed {
            status,
            headers: stored_headers,
            manifest,
            ..
        }) => html! {
            p {
                "An HTTP response: status " strong { (status.as_str()) } ", body in "
                (manifest.count()) " chunks, " (manifest.len()) " bytes."
            }
            (headers(&stored_headers))
        },
        Ok(Stored::Unreplayable(why)) => html! {
            p { "An HTTP request that ran without a replayable response: " (format!("{why:?}")) "." }
        },
        Ok(_) => html! { p { "An HTTP record of a kind this console does not know." } },
        Err(_) => html! {
            p { "An application's own outcome (not an HTTP record): " (preview(payload)) }
        },
    }
}

/// The confirmation form of a mend.
pub(super) fn confirm(console: &Console, action: &str, params: &Params) -> Response {
    let (what, button) = match action {
        "release" => (
            "Release the lease: the record is deleted only if it still holds this token, \
             and the next request runs the work again.",
            "Release",
        ),
        "reset" => (
            "Reset the key: its completed or failed record is deleted and the next \
             request runs the work again. A key in flight is refused.",
            "Reset",
        ),
        _ => return page(console, StatusCode::NOT_FOUND, "Not found", html! {}),
    };
    let key = match named_key(params) {
        Ok(key) => key,
        Err(error) => {
            return page(
                console,
                StatusCode::BAD_REQUEST,
                "Bad key",
                html! { p { (error) } },
            )
        }
    };
    let body = html! {
        p { "Key " code { (show::key(key.as_str())) } }
        p { (what) }
        form method="post" action={ "/" (action) } {
            input type="hidden" name="namespace" value=(param(params, "namespace"));
            input type="hidden" name="scope" value=(param(params, "scope"));
            input type="hidden" name="key" value=(param(params, "key"));
            input type="hidden" name="token" value=(param(params, "token"));
            input type="hidden" name="csrf" value=(console.csrf);
            p { label { "Reason (for the audit log) " input name="reason" required size="60"; } }
            p { label { "By " input name="by" placeholder="console"; } }
            button { (button) }
        }
    };
    page(console, StatusCode::OK, &format!("{button}?"), body)
}

/// The mend's reason and who asked, or the page refusing a missing reason.
pub(super) fn audit_fields<'a>(
    console: &Console,
    form: &'a Params,
) -> Result<(&'a str, &'a str), Box<Response>> {
    let reason = param(form, "reason").trim();
    if reason.is_empty() {
        let body = html! { p { "A reason is required; nothing changed." } };
        return Err(Box::new(page(
            console,
            StatusCode::BAD_REQUEST,
            "Reason required",
            body,
        )));
    }
    let by = match param(form, "by").trim() {
        "" => "console",
        by => by,
    };
    Ok((by, reason))
}

/// Releases a lease: the fenced `remove` that `idem release` uses.
pub(super) async fn release(console: &Console, form: &Params) -> Response {
    let (by, reason) = match audit_fields(console, form) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let key = match named_key(form) {
        Ok(key) => key,
        Err(error) => {
            return page(
                console,
                StatusCode::BAD_REQUEST,
                "Bad key",
                html! { p { (error) } },
            )
        }
    };
    let token = match show::parse_token(param(form, "token")) {
        Ok(token) => token,
        Err(error) => {
            return page(
                console,
                StatusCode::BAD_REQUEST,
                "Bad token",
                html! { p { (error) } },
            )
        }
    };
    let store = Arc::clone(&console.store);
    let answer = store.remove(key.as_str(), token).await;
    let outcome = match &answer {
        Ok(true) => "released",
        Ok(false) => "refused",
        Err(_) => "error",
    };
    tracing::info!(target: "idem::audit", store = %console.store_name,
        namespace = param(form, "namespace"), key = %key_hash(key.as_str()), outcome, by, reason,
        via = "console", "idem release: {outcome}");
    let shown = show::key(key.as_str());
    match answer {
        Ok(true) => page(
            console,
            StatusCode::OK,
            "Released",
            html! { p { "Released " code { (shown) } ": the next request runs the work again." } },
        ),
        Ok(false) => {
            let now = match store.load(key.as_str()).await {
                Ok(None) => "no live record is there".to_owned(),
                Ok(Some(record)) if record.state != State::InFlight => {
                    format!("the record is {}, not in flight", show::state(&record))
                }
                Ok(Some(record)) => format!(
                    "the record holds another token now ({}): its owner changed since you looked",
                    record.token
                ),
                Err(error) => format!("the store failed reading it back: {error}"),
            };
            page(
                console,
                StatusCode::CONFLICT,
                "Refused",
                html! { p { "Refused to release " code { (shown) } ": " (now) "; nothing changed." } },
            )
        }
        Err(error) => page(
            console,
            StatusCode::BAD_GATEWAY,
            "Store error",
            html! { p { "The store failed: " (error.to_string()) "; whether the record was deleted is unknown." } },
        ),
    }
}

/// Resets a settled key: `Idempotent::reset_because`, as `idem reset` does.
pub(super) async fn reset(console: &Console, form: &Params) -> Response {
    let (by, reason) = match audit_fields(console, form) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let key = match named_key(form) {
        Ok(key) => key,
        Err(error) => {
            return page(
                console,
                StatusCode::BAD_REQUEST,
                "Bad key",
                html! { p { (error) } },
            )
        }
    };
    let idem = idem_core::Idempotent::new(Arc::clone(&console.store))
        .with_namespace(param(form, "namespace"))
        .scoped(param(form, "scope"));
    let shown = show::key(key.as_str());
    match idem.reset_because(param(form, "key"), by, reason).await {
        Ok(Reset::Deleted(state)) => page(
            console,
            StatusCode::OK,
            "Reset",
            html! { p { "Reset " code { (shown) } ": deleted its " (show::settled(state)) " record; the next request runs the work again." } },
        ),
        Ok(Reset::InFlight) => page(
            console,
            StatusCode::CONFLICT,
            "Refused",
            html! { p { "Refused to reset " code { (shown) } ": it is in flight; nothing changed. A worker known to be dead is released instead." } },
        ),
        Ok(_) => page(
            console,
            StatusCode::OK,
            "Nothing to reset",
            html! { p { "No live record for " code { (shown) } " (never used, released, reset or expired)." } },
        ),
        Err(error) => page(
            console,
            StatusCode::BAD_GATEWAY,
            "Store error",
            html! { p { "The reset failed: " (error.to_string()) } },
        ),
    }
}
