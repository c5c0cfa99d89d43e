//! A tonic payments service whose `Charge` call is safe to retry:
//! `idem::tonic`'s server layer runs it once per AIP-155 `request_id` and
//! replays its answer to every retry, and the client's `RetryLayer`
//! retries a call only where that is safe. The keys live in a SQLite file,
//! so they outlast a restart.
//!
//! ```text
//! cargo run -p example-grpc-payments
//! ```
//!
//! It serves on a loopback port, charges once, sends the same charge
//! again as a retry would, and prints both answers (the second replayed)
//! and the one charge made. `cargo test -p example-grpc-payments` does the
//! same and checks it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idem::sqlite::SqliteStore;
use idem::tonic::{IdempotencyLayer, RetryLayer, RetryService};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// The code generated from `proto/payments.proto` (by `build.rs`).
pub mod proto {
    #![allow(missing_docs, missing_debug_implementations)]
    tonic::include_proto!("payments");
}

use proto::payments_client::PaymentsClient;
use proto::payments_server::{self, PaymentsServer};
use proto::{Charge, ChargeRequest};

/// The full path of the call the layers protect.
const CHARGE: &str = "/payments.Payments/Charge";

/// The service: every charge it makes is counted, the side effect a retry
/// must not repeat.
#[derive(Clone, Default)]
struct Payments {
    charges: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl payments_server::Payments for Payments {
    async fn charge(&self, request: Request<ChargeRequest>) -> Result<Response<Charge>, Status> {
        let request = request.into_inner();
        if request.amount <= 0 {
            // Recorded and replayed: a retry would be refused again.
            return Err(Status::invalid_argument("the amount must be positive"));
        }
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        println!(
            "charging {} {} (charge {n})",
            request.amount, request.currency
        );
        Ok(Response::new(Charge {
            id: format!("ch_{n}"),
            amount: request.amount,
            currency: request.currency,
        }))
    }
}

/// Serves `payments` on a loopback port, its `Charge` keyed by
/// `request_id` in a SQLite file at `keys`.
async fn serve(payments: Payments, keys: &Path) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let store = SqliteStore::open(keys).await?;
    let layer = IdempotencyLayer::new(store).unary_keyed_by(CHARGE, |request: &ChargeRequest| {
        Some(request.request_id.clone())
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(PaymentsServer::new(payments))
            .serve_with_incoming(incoming),
    );
    Ok(address)
}

/// A client whose `Charge` calls are retried safely.
fn client(
    address: SocketAddr,
) -> Result<PaymentsClient<RetryService<Channel>>, Box<dyn std::error::Error>> {
    let channel = Channel::from_shared(format!("http://{address}"))?.connect_lazy();
    let channel = tower::ServiceBuilder::new()
        .layer(RetryLayer::new().method(CHARGE))
        .service(channel);
    Ok(PaymentsClient::new(channel))
}

/// Charges once, then again as a retry would; the two answers and whether
/// the second was replayed.
async fn charge_twice(
    client: &mut PaymentsClient<RetryService<Channel>>,
) -> Result<(Charge, Charge, bool), Status> {
    let request = ChargeRequest {
        request_id: "5f0c6a8e-6b1d-4c36-9d0e-2f4a1c7b9e21".into(),
        amount: 1250,
        currency: "EUR".into(),
    };
    let first = client.charge(request.clone()).await?.into_inner();
    let again = client.charge(request).await?;
    let replayed = again.metadata().get("idempotent-replayed").is_some();
    Ok((first, again.into_inner(), replayed))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payments = Payments::default();
    let address = serve(payments.clone(), Path::new("grpc-payments-keys.db")).await?;
    let mut client = client(address)?;
    let (first, again, replayed) = charge_twice(&mut client).await?;
    println!("first answer: {first:?}");
    println!("retry answer: {again:?} (replayed: {replayed})");
    println!("charges made: {}", payments.charges.load(Ordering::SeqCst));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retried_charge_charges_once() {
        let dir = tempfile::tempdir().unwrap();
        let payments = Payments::default();
        let address = serve(payments.clone(), &dir.path().join("keys.db"))
            .await
            .unwrap();
        let mut client = client(address).unwrap();
        let (first, again, replayed) = charge_twice(&mut client).await.unwrap();
        assert_eq!(first, again);
        assert!(replayed);
        assert_eq!(payments.charges.load(Ordering::SeqCst), 1);
    }
}
