//! A first call, a replay, a conflict and a mismatch, on `MemoryStore`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, Idempotent, MemoryStore};
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotent::new(MemoryStore::new());
    let charges = Arc::new(AtomicUsize::new(0));
    let order = json!({"amount": 1250, "currency": "EUR"});
    let charge = |delay: Duration| {
        let charges = charges.clone();
        move || async move {
            tokio::time::sleep(delay).await;
            let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, String>(json!({"charge": format!("ch_{n}"), "amount": 1250}))
        }
    };

    let first = idem
        .execute("order-7f3a", &order, charge(Duration::ZERO))
        .await;
    println!("first call   -> {:?}", first.map(|v| v.to_string()));

    let replay = idem
        .execute("order-7f3a", &order, charge(Duration::ZERO))
        .await;
    println!(
        "retry        -> {:?} (replayed, not run)",
        replay.map(|v| v.to_string())
    );

    let slow = idem.execute("order-8b1c", &order, charge(Duration::from_millis(100)));
    let racing = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        idem.execute("order-8b1c", &order, charge(Duration::ZERO))
            .await
    };
    let (owner, conflict) = tokio::join!(slow, racing);
    println!("owner        -> {:?}", owner.map(|v| v.to_string()));
    match conflict {
        Err(Error::InProgress { retry_after }) => {
            println!("racing retry -> in progress, retry after {retry_after:?}")
        }
        other => println!("racing retry -> {other:?}"),
    }

    let altered = json!({"amount": 99999, "currency": "EUR"});
    match idem
        .execute("order-7f3a", &altered, charge(Duration::ZERO))
        .await
    {
        Err(e @ Error::Mismatch) => println!("altered body -> refused: {e}"),
        other => println!("altered body -> {other:?}"),
    }

    println!(
        "charges made: {} for 2 orders",
        charges.load(Ordering::SeqCst)
    );
}
