//! The PostgreSQL queue over TLS, as managed databases serve it: a server
//! this binary starts with TLS only and client certificates required
//! (`hostssl … clientcert=verify-full`), certificates it makes, and
//! `sslmode=verify-full` with the CA and the client certificate from the
//! URL. A job goes through enqueue, claim and complete; a server signed by
//! another CA is refused at connect, naming the cause. Skipped with a
//! reason without PostgreSQL's binaries, failed then under `CI`.

use std::time::{Duration, Instant};

use idem_inbox::queue::{NewJob, PostgresQueue, Queue};
use idem_testing::postgres::PgCluster;
use idem_testing::process::server_ports;
use idem_testing::tls::{pg_tls_server, Certs, ServerCert};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_queued_over_verified_tls_and_a_wrong_ca_is_refused() {
    let started = Instant::now();
    let cluster = match PgCluster::new() {
        Ok(cluster) => cluster,
        Err(reason) => return idem_testing::skip::<()>(&reason).unwrap_or(()),
    };
    let dir = cluster.path("certs");
    std::fs::create_dir(&dir).expect("a directory for the certificates");
    let certs = Certs::new(&dir);
    let port = server_ports(1, 0)[0];
    let _server = pg_tls_server(&cluster, &certs, ServerCert::Good, "good", port, false)
        .unwrap_or_else(|e| panic!("{e}"));
    let booted = started.elapsed();
    let url = |ca: &str| {
        let file = |name: &str| certs.path(name).display().to_string();
        format!(
            "postgres://postgres:hunter2@localhost:{port}/postgres?sslmode=verify-full\
             &sslrootcert={}&sslcert={}&sslkey={}",
            file(ca),
            file("client.pem"),
            file("client.key")
        )
    };

    let error = PostgresQueue::connect(&url("other-ca.pem"))
        .await
        .expect_err("another CA's trust refuses the server");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.to_lowercase().contains("unknownissuer"), "{text}");

    let queue = PostgresQueue::connect(&url("ca.pem"))
        .await
        .expect("the queue over TLS")
        .with_table(&idem_testing::unique_name("idem_inbox_tls"))
        .unwrap();
    queue.migrate().await.expect("the tables");
    let enqueued = queue
        .enqueue(NewJob::new("stripe", "evt_tls", b"{}".to_vec()))
        .await
        .expect("enqueued");
    let jobs = queue
        .claim(4, Duration::from_secs(30))
        .await
        .expect("claimed");
    assert_eq!(jobs.len(), 1);
    assert_eq!(&jobs[0].id, enqueued.id());
    assert!(queue.complete(&jobs[0]).await.unwrap().is_applied());
    assert!(queue
        .claim(4, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    eprintln!(
        "postgres queue over TLS: {:?} ({booted:?} to start the server)",
        started.elapsed()
    );
}
