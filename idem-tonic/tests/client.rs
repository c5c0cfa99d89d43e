//! The client layer against a real tonic server behind the server layer:
//! one key per call kept across retries, retries only where safe, and one
//! effect when the connection is cut mid-call.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::backoff::Backoff;
use idem_core::{Idempotent, MemoryStore};
use idem_testing::{StoreKind, TestStore};
use idem_tonic::{Code, IdempotencyLayer, RetryLayer};
use idem_tonic_testing::{listener, PaymentsClient, CHARGE};
use support::{charge, serve};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tower::ServiceBuilder;

/// A TCP proxy whose open connections can be cut at once.
struct Proxy {
    address: SocketAddr,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn to(target: SocketAddr) -> Proxy {
        let (listener, address) = listener().await;
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let open = Arc::clone(&connections);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                open.lock().unwrap().push(task);
            }
        });
        Proxy {
            address,
            connections,
            accept,
        }
    }

    /// Closes every connection open now, both ways.
    fn cut(&self) -> usize {
        let open: Vec<_> = self.connections.lock().unwrap().drain(..).collect();
        for task in &open {
            task.abort();
        }
        open.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn retrying(
    address: SocketAddr,
    layer: RetryLayer,
) -> PaymentsClient<idem_tonic::RetryService<Channel>> {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_lazy();
    PaymentsClient::new(ServiceBuilder::new().layer(layer).service(channel))
}

fn fast() -> RetryLayer {
    RetryLayer::new().method(CHARGE).with_backoff(Backoff::new(
        Duration::from_millis(1),
        Duration::from_millis(5),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_mid_flight_is_retried_under_its_key_and_charges_once() {
    for kind in [StoreKind::Memory, StoreKind::Redis] {
        let Some(fresh) = kind.fresh().await else {
            continue;
        };
        let idem = Idempotent::from_arc(fresh.store).with_namespace("grpc");
        let server = serve(IdempotencyLayer::from_idempotent(idem).unary(CHARGE)).await;
        let proxy = Proxy::to(server.address).await;
        // The retry waits for the running call's answer instead of taking
        // ABORTED with the lease's whole time as its pushback.
        let mut client = retrying(proxy.address, fast().with_wait(Duration::from_secs(10)));
        let call = tokio::spawn(async move { client.charge(charge(1250, "slow")).await });

        let payments = server.payments.clone();
        for _ in 0..2000 {
            if payments.slow_entered() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            payments.slow_entered(),
            1,
            "{kind}: the call reached the handler"
        );
        assert!(proxy.cut() >= 1, "{kind}: a connection to cut");
        payments.release_slow(1);

        let reply = call.await.unwrap().expect("the retry gets the answer");
        assert_eq!(reply.get_ref().run, 1, "{kind}");
        assert_eq!(payments.charges(), 1, "{kind}: one effect");
        assert_eq!(payments.calls(), 1, "{kind}: the handler ran once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_unavailable_and_pushback_are_retried() {
    let server = serve(IdempotencyLayer::new(MemoryStore::new()).unary(CHARGE)).await;
    let mut client = retrying(server.address, fast().with_max_attempts(3));

    // UNAVAILABLE releases the key, and the client tries again, up to its
    // attempts.
    let status = client.charge(charge(1, "unavailable")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.payments.calls(), 3);

    // An answer a retry would get again is not retried.
    let status = client
        .charge(charge(1, "invalid_argument"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(server.payments.calls(), 4);

    // A caller's own key is kept: a second logical call under it replays.
    let first = {
        let mut request = tonic::Request::new(charge(2, ""));
        request
            .metadata_mut()
            .insert("idempotency-key", "order-7".parse().unwrap());
        client.charge(request).await.unwrap().into_inner()
    };
    let mut request = tonic::Request::new(charge(2, ""));
    request
        .metadata_mut()
        .insert("idempotency-key", "order-7".parse().unwrap());
    let again = client.charge(request).await.unwrap();
    assert!(again.metadata().get("idempotent-replayed").is_some());
    assert_eq!(again.into_inner(), first);
    // Without one, each logical call gets a key of its own.
    client.charge(charge(2, "")).await.unwrap();
    client.charge(charge(2, "")).await.unwrap();
    assert_eq!(server.payments.charges(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_flight_is_retried_after_its_pushback() {
    // A short lease makes the pushback (the lease left) short.
    let idem = Idempotent::new(MemoryStore::new())
        .with_namespace("grpc")
        .with_lease(Duration::from_millis(600));
    let server = serve(IdempotencyLayer::from_idempotent(idem).unary(CHARGE)).await;
    let mut first = retrying(server.address, fast());
    let mut second = first.clone();
    let keyed = || {
        let mut request = tonic::Request::new(charge(3, "slow"));
        request
            .metadata_mut()
            .insert("idempotency-key", "pushed-back".parse().unwrap());
        request
    };
    let running = tokio::spawn(async move { first.charge(keyed()).await });
    let payments = server.payments.clone();
    for _ in 0..2000 {
        if payments.slow_entered() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retried = tokio::spawn(async move { second.charge(keyed()).await });
    payments.release_slow(1);
    let first = running.await.unwrap().unwrap().into_inner();
    let second = retried.await.unwrap().expect("retried after the pushback");
    assert_eq!(second.into_inner(), first);
    assert_eq!(payments.charges(), 1);
}
