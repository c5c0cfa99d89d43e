//! Test support for `idem-tonic`: a payments service generated from
//! `proto/payments.proto` by protox and tonic-prost-build (no `protoc`),
//! whose `Charge` counts every charge it makes, and a loopback server to
//! run it behind a layer.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::codegen::tokio_stream;
use tonic::{Code, Request, Response, Status};

/// The generated messages, client and server of `idem.test.Payments`.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod proto {
    tonic::include_proto!("idem.test");
}

pub use proto::payments_client::PaymentsClient;
pub use proto::payments_server::PaymentsServer;
pub use proto::{ChargeReply, ChargeRequest};

/// The full path of the unary call.
pub const CHARGE: &str = "/idem.test.Payments/Charge";
/// The full path of the server-streaming call.
pub const WATCH: &str = "/idem.test.Payments/Watch";

/// The service: every charge it makes is counted, once per call that
/// reaches it.
#[derive(Debug, Clone, Default)]
pub struct Payments {
    charges: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    gate: Arc<Gate>,
}

/// Holds `slow` charges until the test lets them go on.
#[derive(Debug)]
struct Gate {
    permits: Semaphore,
    entered: AtomicU64,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            permits: Semaphore::new(0),
            entered: AtomicU64::new(0),
        }
    }
}

impl Payments {
    /// A service that has charged nothing yet.
    pub fn new() -> Payments {
        Payments::default()
    }

    /// How many charges the handler has made.
    pub fn charges(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }

    /// How many calls reached the handler, charged or not.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many `slow` charges have entered the handler.
    pub fn slow_entered(&self) -> u64 {
        self.gate.entered.load(Ordering::SeqCst)
    }

    /// Lets `n` held `slow` charges go on.
    pub fn release_slow(&self, n: usize) {
        self.gate.permits.add_permits(n);
    }

    fn charge_now(&self, request: &ChargeRequest) -> ChargeReply {
        let run = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        ChargeReply {
            charge_id: format!("ch_{run}"),
            amount: request.amount,
            run,
        }
    }
}

#[tonic::async_trait]
impl proto::payments_server::Payments for Payments {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        let reply = match request.outcome.as_str() {
            "" => self.charge_now(&request),
            "slow" => {
                self.gate.entered.fetch_add(1, Ordering::SeqCst);
                let permit = self.gate.permits.acquire().await;
                drop(permit.map(|permit| permit.forget()));
                self.charge_now(&request)
            }
            "invalid_argument" => {
                let mut status = Status::invalid_argument("amount must be positive");
                status
                    .metadata_mut()
                    .insert("x-reason", "amount".parse().expect("ASCII"));
                return Err(status);
            }
            "unavailable" => return Err(Status::unavailable("the gateway is down")),
            other => return Err(Status::new(Code::Unknown, format!("no outcome {other}"))),
        };
        let mut response = Response::new(reply);
        response
            .metadata_mut()
            .insert("x-charged-by", "payments".parse().expect("ASCII"));
        Ok(response)
    }

    type WatchStream = tokio_stream::Iter<std::vec::IntoIter<Result<ChargeReply, Status>>>;

    async fn watch(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let amount = request.into_inner().amount;
        let replies = (1..=3)
            .map(|run| {
                Ok(ChargeReply {
                    charge_id: format!("watch_{run}"),
                    amount,
                    run,
                })
            })
            .collect::<Vec<_>>();
        Ok(Response::new(tokio_stream::iter(replies)))
    }
}

/// A loopback listener on a free port, and its address.
pub async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let address = listener.local_addr().expect("a bound address");
    (listener, address)
}

/// The incoming connections of `listener`, as tonic's server takes them.
pub fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
}
