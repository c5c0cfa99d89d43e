//! The Rust side of the Python package's interop test: one
//! `Idempotent::execute` on a store, as a Rust service would call it.
//!
//! `interop STORE_URL NAMESPACE KEY BODY_JSON OUTCOME_JSON` runs work that
//! returns `OUTCOME_JSON` under `KEY` for `BODY_JSON`, and prints one line:
//! `ran <outcome>`, `replayed <outcome>`, `mismatch` or `error <message>`.

use std::sync::atomic::{AtomicBool, Ordering};

use idem_core::{Error, Idempotent};
use idem_stores::StoreUrl;
use serde_json::Value;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, key, body, outcome] = args.as_slice() else {
        eprintln!("usage: interop STORE_URL NAMESPACE KEY BODY_JSON OUTCOME_JSON");
        std::process::exit(2);
    };
    let parse = |text: &str| -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| {
            eprintln!("not JSON: {e}");
            std::process::exit(2)
        })
    };
    let (body, outcome) = (parse(body), parse(outcome));
    let url: StoreUrl = url.parse().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let store = url.open().await.unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let idem = Idempotent::from_arc(store).with_namespace(namespace.as_str());
    let ran = AtomicBool::new(false);
    let result: Result<Value, Error<String>> = idem
        .execute(key, &body, || async {
            ran.store(true, Ordering::SeqCst);
            Ok(outcome)
        })
        .await;
    match result {
        Ok(value) if ran.load(Ordering::SeqCst) => println!("ran {value}"),
        Ok(value) => println!("replayed {value}"),
        Err(Error::Mismatch) => println!("mismatch"),
        Err(error) => println!("error {error}"),
    }
}
