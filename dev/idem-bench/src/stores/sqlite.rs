//! SQLite: `SqliteStore` against the raw protocol through the same writer
//! thread, and the raw protocol with one transaction per operation (no
//! group commit) as a reference.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::Store;
use idem_core::Idempotent;
use idem_sqlite::SqliteStore;
use tempfile::TempDir;

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::{self, BoxError, LEASE, RETENTION};
use crate::protocols::IdemRow;
use crate::report::{paired_ratio, Report};
use crate::runner::{Outcome, Protocol};

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
