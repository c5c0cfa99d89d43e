//! The retry storm through `idem-proxy` in front of a payments API written
//! in Python with no idempotency of its own (`examples/proxy-python`, under
//! `/demo`): the proxy alone must keep every payment to one charge.

use std::time::Duration;

use idem_core::Idempotent;
use idem_demo::{run_storm, StormConfig};
use idem_proxy::{Options, Proxy, Route};
use idem_testing::upstream::{Language, Upstream};
use idem_testing::{StoreKind, TestStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_through_the_proxy_in_front_of_python_charges_every_payment_once() {
    if !Language::Python.available() {
        return;
    }
    let upstream = Upstream::start(Language::Python);
    let fresh = StoreKind::Sqlite
        .fresh()
        .await
        .expect("SQLite needs no server");
    let route = Route::new(Options::from_idempotent(Idempotent::from_arc(fresh.store)));
    let proxy = Proxy::builder(format!("{}/demo", upstream.url()).parse().unwrap())
        .route(route)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(proxy.serve(listener, std::future::pending()));

    let mut config = StormConfig::default();
    config.clients = 8;
    config.payments = 60;
    config.seed = 7;
    config.give_up_after = Duration::from_secs(10);
    let report = run_storm(&url, &config).await.expect("the storm runs");
    println!("{report}");
    assert_eq!(report.double_charged, 0, "payments charged twice\n{report}");
    assert_eq!(report.missing, 0, "payments never charged\n{report}");
    assert_eq!(report.wrong, 0, "wrong charges or answers\n{report}");
    assert_eq!(report.charged, report.intended, "{report}");
    assert!(report.replays > 0, "no replay seen\n{report}");
    assert!(report.mismatches > 0, "no altered body sent\n{report}");
    // Every charge the ledger holds is one the upstream made.
    assert_eq!(upstream.runs(), report.charged);
    drop(fresh.guard);
}
