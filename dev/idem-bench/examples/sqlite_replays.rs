//! Where a SQLite store's replay time goes as the file grows: fills a store
//! file in bulk, then replays records scattered over it from many callers
//! at once and reports, per replay, what the store's one writer thread
//! spent — its user and system CPU, the read system calls and bytes the
//! process made, and the page faults the thread took.
//!
//! ```sh
//! cargo build --release -p idem-bench --example sqlite_replays
//! E=target/release/examples/sqlite_replays
//! $E fill /tmp/s10m.db 10000000                    # once per file
//! $E replay /tmp/s10m.db 10000000 400000 32        # REPLAYS CALLERS
//! $E replay /tmp/s10m.db 10000000 400000 32 4294967296   # with mmap
//! valgrind --tool=cachegrind --cache-sim=yes $E replay /tmp/s10m.db 10000000 20000 32
//! ```
//!
//! Every bulk record is a copy of one record written through `execute`
//! (as `scale-bench` fills), under client keys `r.0` … `r.{N-1}`;
//! replays pick keys in a fixed pseudo-random order over the whole file, so
//! two runs, or the same run under Valgrind at two replay counts, meet the
//! same keys. A first pass over a slice of the keys is not counted, so the
//! figures are of a store that has been serving, not of its first reads.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use idem_core::Idempotent;
use idem_sqlite::SqliteStore;

const BODY: &str = "monthly plan 2024-117";

fn outcome() -> String {
    "ch_".to_owned() + &"7".repeat(95)
}

fn usage() -> ! {
    eprintln!(
        "usage: sqlite_replays fill PATH RECORDS\n       \
         sqlite_replays replay PATH RECORDS REPLAYS CALLERS [MMAP_BYTES]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> u64 {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| usage())
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match args.first().map(String::as_str) {
        Some("fill") => {
            let path = args.get(1).unwrap_or_else(|| usage());
            runtime.block_on(fill(Path::new(path), number(2)));
        }
        Some("replay") => {
            let path = args.get(1).unwrap_or_else(|| usage());
            let mmap = args.get(5).map(|_| number(5));
            runtime.block_on(replay(
                Path::new(path),
                number(2),
                number(3),
                number(4) as usize,
                mmap,
            ));
        }
        _ => usage(),
    }
}

async fn fill(path: &Path, records: u64) {
    let store = SqliteStore::open(path).await.expect("the store opens");
    let idem = Idempotent::new(store.clone());
    let _: String = idem
        .execute("r.t", &BODY, || async { Ok::<_, Infallible>(outcome()) })
        .await
        .expect("the template record is written");
    let prefix = idem.key("r.").expect("a valid key").as_str().to_owned();
    let template = idem.key("r.t").expect("a valid key").as_str().to_owned();
    drop(idem);
    drop(store);
    let conn = rusqlite::Connection::open(path).expect("a second connection");
    conn.busy_timeout(std::time::Duration::from_secs(60))
        .expect("a busy timeout");
    let started = Instant::now();
    let chunk = 250_000;
    let mut at = 0;
    while at < records {
        let end = (at + chunk).min(records);
        conn.execute(
            "WITH RECURSIVE s(n) AS (SELECT ?2 UNION ALL SELECT n + 1 FROM s WHERE n < ?3) \
             INSERT INTO idem_records \
             (key, token, fingerprint, state, payload, lease_until, retain_until) \
             SELECT ?1 || s.n, randomblob(16), t.fingerprint, t.state, t.payload, NULL, \
             CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER) + 86400000000 \
             FROM (SELECT * FROM idem_records WHERE key = ?4) AS t CROSS JOIN s",
            rusqlite::params![prefix, at as i64, end as i64 - 1, template],
        )
        .expect("a bulk insert");
        at = end;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("a checkpoint");
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    println!(
        "filled {records} records in {:.1} s; file {size} bytes",
        started.elapsed().as_secs_f64()
    );
}

/// The key a replay number picks: scattered over the whole file in a fixed
/// order.
fn pick(i: u64, records: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % records.max(1)
}

async fn replay(path: &Path, records: u64, replays: u64, callers: usize, mmap: Option<u64>) {
    let mut store = SqliteStore::open(path).await.expect("the store opens");
    if let Some(bytes) = mmap {
        store = store.with_mmap_size(bytes);
    }
    let idem = Idempotent::new(store);
    // Warm-up: a tenth of the measured count, not counted.
    run(&idem, records, 0, replays / 10, callers).await;
    let writer = writer_thread().expect("the store's writer thread");
    let (thread0, io0) = (task_stat(writer), io());
    let started = Instant::now();
    run(&idem, records, replays / 10, replays, callers).await;
    let elapsed = started.elapsed().as_secs_f64();
    let (thread1, io1) = (task_stat(writer), io());
    let n = replays as f64;
    let tick_us = 1e6 / 100.0; // USER_HZ
    println!(
        "records={records} replays={replays} callers={callers} mmap={}",
        mmap.unwrap_or(0)
    );
    println!(
        "  wall {:.2} us/replay ({:.0} replays/s)",
        elapsed * 1e6 / n,
        n / elapsed
    );
    println!(
        "  writer thread: user {:.2} us, system {:.2} us, minor faults {:.3}, major faults {:.3} per replay",
        (thread1.utime - thread0.utime) as f64 * tick_us / n,
        (thread1.stime - thread0.stime) as f64 * tick_us / n,
        (thread1.minflt - thread0.minflt) as f64 / n,
        (thread1.majflt - thread0.majflt) as f64 / n,
    );
    println!(
        "  process: read calls {:.3}, bytes read by calls {:.0}, bytes read from the disk {:.0} per replay",
        (io1.syscr - io0.syscr) as f64 / n,
        (io1.rchar - io0.rchar) as f64 / n,
        (io1.read_bytes - io0.read_bytes) as f64 / n,
    );
    println!(
        "  writer thread: {:.3} voluntary and {:.3} involuntary context switches per replay",
        (thread1.voluntary - thread0.voluntary) as f64 / n,
        (thread1.involuntary - thread0.involuntary) as f64 / n,
    );
}

/// Replays numbers `from..to` from `callers` concurrent callers.
async fn run(idem: &Idempotent, records: u64, from: u64, to: u64, callers: usize) {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(from));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers.max(1) {
        let (idem, next) = (idem.clone(), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= to {
                    return;
                }
                let key = format!("r.{}", pick(i, records));
                let replayed: Result<String, _> = idem
                    .execute(&key, &BODY, || async {
                        Ok::<_, Infallible>("ran again".to_owned())
                    })
                    .await;
                assert_eq!(replayed.ok(), Some(outcome()), "{key} did not replay");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a replay task");
    }
}

/// The store's writer thread, by the name idem-sqlite gives it.
fn writer_thread() -> Option<u32> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .find_map(|entry| {
            let entry = entry.ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            comm.trim()
                .starts_with("idem-sqlite")
                .then(|| entry.file_name().to_str()?.parse().ok())
                .flatten()
        })
}

#[derive(Default, Clone, Copy)]
struct TaskStat {
    minflt: u64,
    majflt: u64,
    utime: u64,
    stime: u64,
    voluntary: u64,
    involuntary: u64,
}

fn task_stat(tid: u32) -> TaskStat {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // Fields after the parenthesised name: state is field 3.
    let rest = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |field: usize| fields.get(field - 3).copied().unwrap_or(0);
    let status =
        std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
    let switches = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    TaskStat {
        minflt: at(10),
        majflt: at(12),
        utime: at(14),
        stime: at(15),
        voluntary: switches("voluntary_ctxt_switches:"),
        involuntary: switches("nonvoluntary_ctxt_switches:"),
    }
}

#[derive(Default, Clone, Copy)]
struct Io {
    rchar: u64,
    syscr: u64,
    read_bytes: u64,
}

fn io() -> Io {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    Io {
        rchar: value("rchar:"),
        syscr: value("syscr:"),
        read_bytes: value("read_bytes:"),
    }
}
