//! The commands that work on an open store, one function each.

use std::sync::Arc;

use idem_core::inspect::{Inspect, Listing};
use idem_core::observe::key_hash;
use idem_core::store::{Reset, State, StoreError, PURGE_BATCH};
use idem_core::Key;

use crate::{show, KeyArgs, ListArgs};

/// The store as the commands see it.
type Store = Arc<dyn Inspect>;

/// A store error as the line the command prints.
fn failed(error: StoreError) -> String {
    error.to_string()
}

/// The stored key the arguments name.
fn key(args: &KeyArgs) -> Result<Key, String> {
    Key::new(&args.namespace, &args.scope, &args.key).map_err(|e| e.to_string())
}

/// `inspect`: one key's record. Reads only.
pub(crate) async fn inspect(store: &Store, args: &KeyArgs) -> Result<(), String> {
    let key = key(args)?;
    let record = store.load(key.as_str()).await.map_err(failed)?;
    println!("key          {}", show::key(key.as_str()));
    println!("hash         {}", key_hash(key.as_str()));
    let Some(record) = record else {
        println!("state        absent (no live record: never used, released, reset or expired)");
        return Ok(());
    };
    println!("state        {}", show::state(&record));
    println!(
        "retention    {} left",
        show::duration(record.retention_remaining)
    );
    println!("token        {}", record.token);
    println!("fingerprint  {}", record.fingerprint);
    println!(
        "outcome      {} bytes: {}",
        record.payload.len(),
        show::preview(&record.payload)
    );
    Ok(())
}

/// `list`: a page of in-flight or failed records. Reads only.
pub(crate) async fn list(store: &Store, args: &ListArgs) -> Result<(), String> {
    let listing = if args.which.failed {
        Listing::Failed
    } else {
        Listing::InFlight
    };
    let page = store
        .list(listing, args.after.as_deref(), args.limit)
        .await
        .map_err(failed)?;
    for listed in &page.records {
        let record = &listed.record;
        println!(
            "{}  token {}  {}  retention {} left  {} bytes",
            show::key(&listed.key),
            record.token,
            show::state(record),
            show::duration(record.retention_remaining),
            record.payload.len()
        );
    }
    println!("{} record(s) on this page", page.records.len());
    match page.next {
        Some(next) => println!("next page: --after {next}"),
        None => println!("no more pages"),
    }
    Ok(())
}

/// `release`: delete an in-flight record, only if it still holds `token`.
pub(crate) async fn release(store: &Store, args: &KeyArgs, token: &str) -> Result<(), String> {
    let key = key(args)?;
    let token = show::parse_token(token)?;
    if store.remove(key.as_str(), token).await.map_err(failed)? {
        println!(
            "released {}: the next request runs the work again",
            show::key(key.as_str())
        );
        return Ok(());
    }
    // Say why nothing changed, from what is there now.
    let why = match store.load(key.as_str()).await.map_err(failed)? {
        None => "no live record is there".to_owned(),
        Some(record) if record.state != State::InFlight => {
            format!("the record is {}, not in flight", show::state(&record))
        }
        Some(record) if record.token != token => format!(
            "the record holds another token now ({}; {}): its owner changed since you looked",
            record.token,
            show::state(&record)
        ),
        // It changed between the two reads.
        Some(record) => format!("the record changed meanwhile ({})", show::state(&record)),
    };
    Err(format!(
        "refused to release {}: {why}; nothing changed",
        show::key(key.as_str())
    ))
}

/// `reset`: delete a settled record, with an audit line; refuses one in
/// flight.
pub(crate) async fn reset(
    store: &Store,
    args: &KeyArgs,
    reason: &str,
    by: Option<String>,
) -> Result<(), String> {
    let key = key(args)?;
    let by = by
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let idem = idem_core::Idempotent::new(Arc::clone(store))
        .with_namespace(args.namespace.as_str())
        .scoped(args.scope.as_str());
    let reset = idem
        .reset_because(&args.key, &by, reason)
        .await
        .map_err(|e| e.to_string())?;
    let shown = show::key(key.as_str());
    match reset {
        Reset::Deleted(state) => {
            println!(
                "reset {shown}: deleted its {} record; the next request runs the work again",
                show::settled(state)
            );
            Ok(())
        }
        Reset::InFlight => {
            let now = match store.load(key.as_str()).await.map_err(failed)? {
                Some(record) => format!("{}, token {}", show::state(&record), record.token),
                None => "settled or released since".to_owned(),
            };
            Err(format!(
                "refused to reset {shown}: it is in flight ({now}); nothing changed. \
                 A worker known to be dead is released with `release --token`"
            ))
        }
        _ => {
            println!("nothing to reset for {shown}: no live record (never used, released, reset or expired)");
            Ok(())
        }
    }
}

/// `purge`: delete records past their retention, a batch at a time, or
/// only count them.
pub(crate) async fn purge(store: &Store, dry_run: bool) -> Result<(), String> {
    if dry_run {
        let stats = store.stats().await.map_err(failed)?;
        println!(
            "{} expired record(s) would be purged; nothing deleted (dry run)",
            stats.expired
        );
        return Ok(());
    }
    let mut total = 0;
    loop {
        let purged = store
            .purge_expired(PURGE_BATCH)
            .await
            .map_err(|e| format!("{e} (after purging {total} record(s))"))?;
        total += purged;
        if purged < PURGE_BATCH {
            break;
        }
    }
    println!("purged {total} expired record(s); live records untouched");
    Ok(())
}

/// `stats`: records by state. Reads only.
pub(crate) async fn stats(store: &Store) -> Result<(), String> {
    let stats = store.stats().await.map_err(failed)?;
    println!("in flight    {}", stats.in_flight);
    println!("lapsed       {}", stats.lapsed);
    println!("completed    {}", stats.completed);
    println!("failed       {}", stats.failed);
    println!("expired      {}", stats.expired);
    Ok(())
}
