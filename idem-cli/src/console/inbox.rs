//! The inbox page: a webhook inbox's queue depth and dead letters, and the
//! one mend the `idem-inbox` command has, `requeue`, for one dead letter or
//! all of a source.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use idem_inbox::queue::{JobId, JobInfo, PostgresQueue, Queue, SqliteQueue};
use maud::{html, Markup};

use super::pages::{audit_fields, enc, page};
use super::{param, Console, Params};
use crate::show;

/// The most dead letters a page reads, and a requeue of a source visits.
const DEAD_LIMIT: usize = 1000;

/// An inbox queue opened by URL, and its name without a password.
pub(super) struct Inbox {
    pub(super) queue: Arc<dyn Queue>,
    pub(super) name: String,
}

/// Opens the queue `url` names: a `postgres://` URL (the table given, or
/// the queue's default) or a SQLite file (`sqlite:` before it optional),
/// which must exist: a console does not create queues.
pub(super) async fn open(url: &str, table: Option<&str>) -> Result<Inbox, String> {
    let name = crate::open::redact(url);
    let fail = |e: idem_inbox::queue::QueueError| format!("cannot open the inbox {name}: {e}");
    let queue: Arc<dyn Queue> =
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut queue = PostgresQueue::connect(url).await.map_err(fail)?;
            if let Some(table) = table {
                queue = queue.with_table(table).map_err(fail)?;
            }
            Arc::new(queue)
        } else {
            let path = url.strip_prefix("sqlite:").unwrap_or(url);
            if !std::path::Path::new(path).is_file() {
                return Err(format!("no inbox queue file at {path}"));
            }
            Arc::new(SqliteQueue::open(path).await.map_err(fail)?)
        };
    Ok(Inbox { queue, name })
}

fn no_inbox(console: &Console) -> Response {
    page(
        console,
        StatusCode::NOT_FOUND,
        "Inbox",
        html! { p { "No inbox: start the console with --inbox URL (a SQLite file or a postgres:// URL) to see its queue." } },
    )
}

/// Queue depth and dead letters, filtered by source.
pub(super) async fn list(console: &Console, params: &Params) -> Response {
    let Some(inbox) = &console.inbox else {
        return no_inbox(console);
    };
    let source = param(params, "source");
    let depth = inbox.queue.depth().await;
    let dead = inbox.queue.dead_letters(DEAD_LIMIT).await;
    let body = html! {
        p.note { "Queue " code { (inbox.name) } }
        @match (&depth, &dead) {
            (Ok(depth), Ok(dead)) => p {
                "Waiting or running " strong { (depth.map_or("not counted by this queue".to_owned(), |d| d.to_string())) }
                ", dead letters " strong { (count(dead.len())) } "."
            },
            (Err(error), _) | (_, Err(error)) => p { "The queue failed: " (error.to_string()) },
        }
        form method="get" action="/inbox" {
            label { "source " input name="source" value=(source); }
            " " button { "Filter" }
        }
        @if let Ok(dead) = &dead {
            (dead_table(dead, source))
            @if !source.is_empty() && dead.iter().any(|job| job.source == source) {
                p { a href={ "/inbox/confirm?source=" (enc(source)) } { "Requeue every dead letter of " (source) "…" } }
            }
        }
    };
    page(console, StatusCode::OK, "Inbox dead letters", body)
}

/// `1000+` when the listing was cut at its limit.
fn count(listed: usize) -> String {
    if listed >= DEAD_LIMIT {
        format!("{DEAD_LIMIT}+")
    } else {
        listed.to_string()
    }
}

fn dead_table(dead: &[JobInfo], source: &str) -> Markup {
    let rows: Vec<_> = dead
        .iter()
        .filter(|job| source.is_empty() || job.source == source)
        .collect();
    html! {
        table {
            tr { th { "job" } th { "source" } th { "event id" } th { "attempts" } th { "lapses" } th { "last error" } th {} }
            @for job in &rows {
                tr {
                    td { a href={ "/inbox/job?id=" (enc(job.id.as_str())) } { code { (job.id.as_str()) } } }
                    td { a href={ "/inbox?source=" (enc(&job.source)) } { (job.source) } }
                    td { code { (show::preview(job.event_id.as_bytes())) } }
                    td { (job.attempts) } td { (job.lapses) }
                    td.error { (job.last_error.as_deref().unwrap_or("—")) }
                    td { a href={ "/inbox/confirm?id=" (enc(job.id.as_str())) } { "Requeue…" } }
                }
            }
        }
        @if rows.is_empty() { p { "No dead letters." } }
        p.note { "Oldest first. A dead letter is not handled again until it is requeued." }
    }
}

/// One job, in whatever state, with its history.
pub(super) async fn job(console: &Console, params: &Params) -> Response {
    let Some(inbox) = &console.inbox else {
        return no_inbox(console);
    };
    let id = JobId::new(param(params, "id"));
    let job = match inbox.queue.inspect(&id).await {
        Ok(Some(job)) => job,
        Ok(None) => {
            let body = html! { p { "No job " code { (id.as_str()) } " in this queue." } };
            return page(console, StatusCode::NOT_FOUND, "No job", body);
        }
        Err(error) => {
            let body = html! { p { "The queue failed: " (error.to_string()) } };
            return page(console, StatusCode::BAD_GATEWAY, "Queue error", body);
        }
    };
    let payload = if console.show_payloads {
        html! { code.payload { (show::preview(&job.payload)) } }
    } else {
        html! { span.note { "hidden (start the console with --show-payloads to see it)" } }
    };
    let body = html! {
        table {
            tr { th { "job" } td { code { (job.id.as_str()) } } }
            tr { th { "state" } td { (job.state.as_str()) } }
            tr { th { "source" } td { (job.source) } }
            tr { th { "event id" } td { code { (show::preview(job.event_id.as_bytes())) } } }
            tr { th { "attempts" } td { (job.attempts) } }
            tr { th { "lapses" } td { (job.lapses) } }
            tr { th { "last error" } td { (job.last_error.as_deref().unwrap_or("—")) } }
            tr { th { "payload" } td { (job.payload.len()) " bytes: " (payload) } }
        }
        h2 { "Failed attempts" }
        table {
            tr { th { "attempt" } th { "error" } }
            @for attempt in &job.history {
                tr { td { (attempt.attempt) } td { (attempt.error) } }
            }
        }
        @if job.state == idem_inbox::queue::JobState::Dead {
            p { a href={ "/inbox/confirm?id=" (enc(job.id.as_str())) } { "Requeue this dead letter…" } }
        }
    };
    page(console, StatusCode::OK, "Inbox job", body)
}

/// The confirmation form of a requeue: of one job (`id`) or of every dead
/// letter of a source (`source`).
pub(super) fn confirm(console: &Console, params: &Params) -> Response {
    if console.inbox.is_none() {
        return no_inbox(console);
    }
    let (id, source) = (param(params, "id"), param(params, "source"));
    let what = match (id, source) {
        ("", "") => {
            let body = html! { p { "Name a job or a source." } };
            return page(console, StatusCode::BAD_REQUEST, "Requeue what?", body);
        }
        (id, "") => {
            html! { "Requeue the dead letter " code { (id) } ": it is due at once, its attempts counted afresh." }
        }
        (_, source) => {
            html! { "Requeue every dead letter of the source " strong { (source) } ": each is due at once, its attempts counted afresh." }
        }
    };
    let body = html! {
        p { (what) }
        form method="post" action="/inbox/requeue" {
            input type="hidden" name="id" value=(id);
            input type="hidden" name="source" value=(source);
            input type="hidden" name="csrf" value=(console.csrf);
            p { label { "Reason (for the audit log) " input name="reason" required size="60"; } }
            p { label { "By " input name="by" placeholder="console"; } }
            button { "Requeue" }
        }
    };
    page(console, StatusCode::OK, "Requeue?", body)
}

/// Requeues one dead letter, or every dead letter of a source, each by the
/// queue's `requeue`, as `idem-inbox requeue` does.
pub(super) async fn requeue(console: &Console, form: &Params) -> Response {
    let Some(inbox) = &console.inbox else {
        return no_inbox(console);
    };
    let (by, reason) = match audit_fields(console, form) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let (id, source) = (param(form, "id"), param(form, "source"));
    let ids: Vec<JobId> = match (id, source) {
        ("", "") => {
            let body = html! { p { "Name a job or a source; nothing changed." } };
            return page(console, StatusCode::BAD_REQUEST, "Requeue what?", body);
        }
        (id, "") => vec![JobId::new(id)],
        (_, source) => match inbox.queue.dead_letters(DEAD_LIMIT).await {
            Ok(dead) => dead
                .into_iter()
                .filter(|job| job.source == source)
                .map(|job| job.id)
                .collect(),
            Err(error) => {
                let body = html! { p { "The queue failed listing dead letters: " (error.to_string()) "; nothing changed." } };
                return page(console, StatusCode::BAD_GATEWAY, "Queue error", body);
            }
        },
    };
    let mut requeued = 0usize;
    let mut refused = 0usize;
    for id in &ids {
        let answer = inbox.queue.requeue(id).await;
        let outcome = match &answer {
            Ok(true) => "requeued",
            Ok(false) => "refused",
            Err(_) => "error",
        };
        tracing::info!(target: "idem::audit", inbox = %inbox.name, job = %id, source,
            outcome, by, reason, via = "console", "idem-inbox requeue: {outcome}");
        match answer {
            Ok(true) => requeued += 1,
            Ok(false) => refused += 1,
            Err(error) => {
                let body = html! {
                    p {
                        "The queue failed requeueing " code { (id.as_str()) } ": " (error.to_string())
                        "; whether it was requeued is unknown. " (requeued) " requeued before it."
                    }
                };
                return page(console, StatusCode::BAD_GATEWAY, "Queue error", body);
            }
        }
    }
    if requeued == 0 {
        let body = html! { p { "Nothing requeued: no such dead letter (it may have been requeued already); nothing changed." } };
        return page(console, StatusCode::CONFLICT, "Refused", body);
    }
    let body = html! {
        p {
            "Requeued " strong { (requeued) } " dead letter" @if requeued != 1 { "s" }
            @if refused > 0 { " (" (refused) " no longer dead)" }
            ": a worker handles each at its next claim."
        }
        p { a href="/inbox" { "Back to the inbox" } }
    };
    page(console, StatusCode::OK, "Requeued", body)
}
