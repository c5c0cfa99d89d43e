//! Durable steps with `idem`: a checkout in three steps — reserve the
//! stock, charge the card, email the receipt — each recorded as it
//! finishes, so a run that crashes resumes after the last recorded step
//! instead of charging again.
//!
//! ```text
//! cargo run -p example-durable-steps -- crash  # dies while sending the email
//! cargo run -p example-durable-steps           # resumes: only the email is sent
//! cargo run -p example-durable-steps           # replays the receipt: nothing runs
//! ```
//!
//! The order is kept in a SQLite file in the temporary directory; delete it
//! to start over. `cargo test -p example-durable-steps` does the same.

use std::sync::Mutex;
use std::time::Duration;

use idem::sqlite::SqliteStore;
use idem::{Error, Idempotent};
use serde::{Deserialize, Serialize};

/// How long a crashed run blocks its order before the next call takes it
/// over (the default, 60 s, is for production).
const LEASE: Duration = Duration::from_secs(2);

/// How long a call waits for a crashed run's lease to lapse (then takes the
/// order over) or for a live run's receipt, instead of answering
/// `InProgress` at once.
const WAIT: Duration = Duration::from_secs(5);

#[derive(Serialize)]
struct Order {
    sku: &'static str,
    amount: u64,
}

const ORDER: Order = Order {
    sku: "tea",
    amount: 1250,
};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    reservation: String,
    charge: String,
}

/// The outside world: what it was asked to do, and whether this process
/// dies in the middle of the email.
#[derive(Default)]
struct Shop {
    crash_in_email: bool,
    done: Mutex<Vec<&'static str>>,
}

impl Shop {
    fn effect(&self, what: &'static str) {
        println!("{what}");
        self.done.lock().unwrap().push(what);
    }
}

async fn checkout(idem: &Idempotent, shop: &Shop, id: &str) -> Result<Receipt, Error<String>> {
    idem.execute_steps(id, &ORDER, |steps| async move {
        let reservation = steps
            .step("reserve", || async {
                shop.effect("reserve");
                Ok::<_, String>(format!("res_{}", ORDER.sku))
            })
            .await?;
        // `remote` hands the step a key derived from the order's: sent as the
        // gateway's idempotency key, a charge cut off before its record
        // landed is not made twice on resume.
        let charge = steps
            .remote("charge", |gateway_key| async move {
                shop.effect("charge");
                Ok::<_, String>(format!("ch_{gateway_key}"))
            })
            .await?;
        steps
            .step("email", || async {
                if shop.crash_in_email {
                    panic!("the process died while sending the email");
                }
                shop.effect("email");
                Ok::<_, String>(())
            })
            .await?;
        Ok(Receipt {
            reservation,
            charge,
        })
    })
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("idem-durable-steps.db");
    let idem = Idempotent::new(SqliteStore::open(&path).await?)
        .with_lease(LEASE)
        .with_wait(WAIT);
    let shop = Shop {
        crash_in_email: std::env::args().nth(1).as_deref() == Some("crash"),
        ..Shop::default()
    };
    let receipt = checkout(&idem, &shop, "order-7f3a").await?;
    println!("{receipt:?} (kept in {})", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_checkout_that_crashed_resumes_without_redoing_recorded_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let lease = Duration::from_millis(300);

        // The first process dies in the email step, after the charge.
        let idem = Idempotent::new(SqliteStore::open(&path).await.unwrap()).with_lease(lease);
        let shop = Arc::new(Shop {
            crash_in_email: true,
            ..Shop::default()
        });
        let crashed = {
            let shop = Arc::clone(&shop);
            tokio::spawn(async move { checkout(&idem, &shop, "order-7f3a").await })
        };
        assert!(crashed.await.unwrap_err().is_panic());
        assert_eq!(*shop.done.lock().unwrap(), ["reserve", "charge"]);

        // A new process on the same file waits for the lease to lapse, takes
        // the order over and runs only the step that was not recorded.
        let idem = Idempotent::new(SqliteStore::open(&path).await.unwrap())
            .with_lease(lease)
            .with_wait(Duration::from_secs(30));
        let shop = Shop::default();
        let receipt = checkout(&idem, &shop, "order-7f3a").await.unwrap();
        assert_eq!(*shop.done.lock().unwrap(), ["email"]);

        // The finished order replays its receipt; nothing runs.
        let shop = Shop::default();
        assert_eq!(checkout(&idem, &shop, "order-7f3a").await.unwrap(), receipt);
        assert!(shop.done.lock().unwrap().is_empty());
    }
}
