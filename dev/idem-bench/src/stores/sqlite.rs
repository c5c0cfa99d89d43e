//! SQLite: `SqliteStore` against the raw protocol through the same writer
//! thread, and the raw protocol with one transaction per operation (no
//! group commit) as a reference.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use idem_core::Idempotent;
use idem_sqlite::SqliteStore;
use tempfile::TempDir;

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::{self, BoxError, LEASE, RETENTION};
use crate::protocols::IdemRow;
use crate::report::{paired_ratio, Report};
use crate::runner::{Outcome, Protocol};
use crate::stores::target::{self, Footprint, Target};

/// The SQLite rows: two stores (files), one with the default group commit
/// and one limited to one operation per transaction.
#[derive(Debug)]
pub(crate) struct SqliteBench {
    grouped: Arc<SqliteStore>,
    single: Arc<SqliteStore>,
    files: Vec<PathBuf>,
    /// Held so that a temporary folder lives as long as the bench.
    _dir: Option<TempDir>,
}

impl SqliteBench {
    /// Opens both files in `dir`, or in a temporary folder.
    pub(crate) async fn open(
        dir: Option<&Path>,
        mmap: Option<u64>,
        tag: &str,
    ) -> Result<SqliteBench, BoxError> {
        let (temp, dir) = match dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let temp = tempfile::Builder::new().prefix("idem-bench").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let grouped_path = dir.join(format!("{tag}-grouped.db"));
        let single_path = dir.join(format!("{tag}-single.db"));
        let mapped = |store: SqliteStore| match mmap {
            Some(bytes) => store.with_mmap_size(bytes),
            None => store,
        };
        let grouped = mapped(SqliteStore::open(&grouped_path).await?);
        let single = mapped(SqliteStore::open(&single_path).await?).with_max_batch(1);
        Ok(SqliteBench {
            grouped: Arc::new(grouped),
            single: Arc::new(single),
            files: vec![grouped_path, single_path],
            _dir: temp,
        })
    }
}

#[async_trait]
impl Bench for SqliteBench {
    fn store(&self) -> &'static str {
        "sqlite"
    }

    fn contestants(&self) -> Vec<Contestant> {
        let raw: Arc<dyn Protocol> = Arc::new(Raw::new(self.grouped.clone()));
        let single: Arc<dyn Protocol> = Arc::new(Raw::new(self.single.clone()));
        let store: Arc<dyn Store> = self.grouped.clone();
        let idem: Arc<dyn Protocol> = Arc::new(IdemRow::new(Idempotent::from_arc(store)));
        vec![
            Contestant {
                kind: Kind::Raw,
                make: Box::new(move || raw.clone()),
                fresh: false,
                round_trips: |_| 0,
            },
            Contestant {
                kind: Kind::Single,
                make: Box::new(move || single.clone()),
                fresh: false,
                round_trips: |_| 0,
            },
            Contestant {
                kind: Kind::Idem,
                make: Box::new(move || idem.clone()),
                fresh: false,
                round_trips: |_| 0,
            },
        ]
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        Ok(None)
    }

    async fn finish(&self, report: &mut Report) -> Result<(), BoxError> {
        group_commit(report);
        for file in &self.files {
            for suffix in ["", "-wal", "-shm"] {
                let mut name = file.clone().into_os_string();
                name.push(suffix);
                // Gone already is fine: WAL files vanish on a clean close.
                let _ = std::fs::remove_file(name);
            }
        }
        Ok(())
    }
}

/// idem (with group commit) against the raw protocol without it: the
/// ratio group commit is expected to win at high concurrency.
fn group_commit(report: &mut Report) {
    let mut section = String::from(
        "sqlite: idem (group commit) over raw with one transaction per operation, by ops/s",
    );
    let mut lines = Vec::new();
    for idem in report
        .rows
        .iter()
        .filter(|r| r.store == "sqlite" && r.kind == Kind::Idem)
    {
        let Some(single) = report.peer(idem, Kind::Single) else {
            continue;
        };
        let Some(ratio) = paired_ratio(&idem.reps, &single.reps) else {
            continue;
        };
        let _ = write!(
            section,
            "\n  {:<10} c{:<3} {ratio:.2}",
            idem.workload.name(),
            idem.concurrency
        );
        lines.push(format!(
            "groupcommit sqlite {} c{} {ratio:.3}",
            idem.workload.name(),
            idem.concurrency
        ));
    }
    if !lines.is_empty() {
        report.sections.push(section);
        report.lines.extend(lines);
    }
}

/// The bare claim and complete statements, through a store's writer thread
/// (the helper idem-sqlite keeps for this comparison).
struct Raw {
    store: Arc<SqliteStore>,
    payload: Vec<u8>,
}

impl Raw {
    fn new(store: Arc<SqliteStore>) -> Raw {
        Raw {
            store,
            payload: fixture::outcome_payload(),
        }
    }
}

#[async_trait]
impl Protocol for Raw {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        match self.store.raw_claim(key, token, LEASE, RETENTION).await? {
            None => {
                if self
                    .store
                    .raw_complete(key, token, &self.payload, RETENTION)
                    .await?
                {
                    Ok(Outcome::Ran)
                } else {
                    Err("raw completion lost its claim".into())
                }
            }
            // An in-flight record holds no payload yet.
            Some(payload) if payload.is_empty() => Ok(Outcome::InProgress),
            Some(_) => Ok(Outcome::Replayed),
        }
    }
}

/// SQLite in its own file; bulk rows go in through a second connection,
/// one `INSERT … SELECT` over a recursive series per chunk.
pub(crate) struct SqliteTarget {
    store: Arc<SqliteStore>,
    path: PathBuf,
    _dir: Option<TempDir>,
}

impl SqliteTarget {
    pub(crate) async fn open(
        dir: Option<&Path>,
        mmap: Option<u64>,
        tag: &str,
    ) -> Result<SqliteTarget, BoxError> {
        let (temp, dir) = match dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let temp = tempfile::Builder::new().prefix("idem-bench").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let path = dir.join(format!("{tag}-scale.db"));
        let mut store = SqliteStore::open(&path).await?;
        if let Some(bytes) = mmap {
            store = store.with_mmap_size(bytes);
        }
        Ok(SqliteTarget {
            store: Arc::new(store),
            path,
            _dir: temp,
        })
    }

    /// Runs `f` on a fresh connection to the file, off the runtime.
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, BoxError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&path)?;
            conn.busy_timeout(Duration::from_secs(60))?;
            f(&conn)
        })
        .await?
        .map_err(Into::into)
    }

    fn wal(&self) -> PathBuf {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        wal.into()
    }

    fn file_sizes(&self) -> (u64, u64) {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        (size(&self.path), size(&self.wal()))
    }
}

#[async_trait]
impl Target for SqliteTarget {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        template: &str,
        _record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        let (prefix, template) = (prefix.to_owned(), template.to_owned());
        let retain_us = i64::try_from(target::BULK_RETENTION.as_micros()).unwrap_or(i64::MAX);
        self.with_conn(move |conn| {
            let mut at = from;
            while at < to {
                let end = (at + target::SQL_CHUNK).min(to);
                // Deadlines are unix microseconds in this table.
                conn.execute(
                    "WITH RECURSIVE s(n) AS (SELECT ?2 UNION ALL SELECT n + 1 FROM s WHERE n < ?3) \
                     INSERT INTO idem_records \
                     (key, token, fingerprint, state, payload, lease_until, retain_until) \
                     SELECT ?1 || s.n, randomblob(16), t.fingerprint, t.state, t.payload, NULL, \
                     CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER) + ?5 \
                     FROM (SELECT * FROM idem_records WHERE key = ?4) AS t CROSS JOIN s",
                    rusqlite::params![prefix, at as i64, end as i64 - 1, template, retain_us],
                )?;
                at = end;
            }
            Ok(())
        })
        .await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        // A checkpoint folds the log into the file, as the store's own
        // automatic checkpoints do over time.
        self.with_conn(|conn| conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())))
            .await?;
        let (file, wal) = self.file_sizes();
        Ok(Footprint {
            bytes: file + wal,
            how: format!("file {file} B + log {wal} B after a checkpoint"),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        let n: i64 = self
            .with_conn(|conn| conn.query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0)))
            .await?;
        Ok(Some(n as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        let (file, wal) = self.file_sizes();
        let (free, page): (i64, i64) = self
            .with_conn(|conn| {
                let free = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
                let page = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
                Ok((free, page))
            })
            .await?;
        Ok(vec![format!(
            "file {file} B, log {wal} B, free pages {free} ({} B) awaiting reuse",
            free * page
        )])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        for path in [self.path.clone(), self.wal(), {
            let mut shm = self.path.clone().into_os_string();
            shm.push("-shm");
            shm.into()
        }] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }
}
