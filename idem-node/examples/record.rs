//! The record a key holds, as the Node package's tests read it to check
//! that `makeIdempotent` stores exactly what Rust's `execute` stores.
//!
//! `record STORE_URL NAMESPACE KEY` prints one line: `absent`, or the
//! record's state and its payload as written (`completed {"ok":true}`).

use idem_core::Key;
use idem_stores::StoreUrl;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, key] = args.as_slice() else {
        eprintln!("usage: record STORE_URL NAMESPACE KEY");
        std::process::exit(2);
    };
    let fail = |message: String| -> ! {
        eprintln!("{message}");
        std::process::exit(2)
    };
    let url: StoreUrl = url.parse().unwrap_or_else(|e| fail(format!("{e}")));
    let key = Key::new(namespace, "", key).unwrap_or_else(|e| fail(format!("{e}")));
    let store = url.open().await.unwrap_or_else(|e| fail(format!("{e}")));
    match store.load(key.as_str()).await {
        Ok(Some(record)) => println!(
            "{} {}",
            format!("{:?}", record.state).to_lowercase(),
            String::from_utf8_lossy(&record.payload)
        ),
        Ok(None) => println!("absent"),
        Err(error) => fail(format!("{error}")),
    }
}
