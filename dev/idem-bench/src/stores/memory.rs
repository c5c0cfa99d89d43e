//! The in-process `MemoryStore`: idem's own overhead, with no I/O to hide it.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use idem_core::{Idempotent, MemoryStore};

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::BoxError;
use crate::protocols::{IdemRow, StoreRaw};
use crate::report::{fixed, Report};
use crate::runner::Protocol;
use crate::stats;
use crate::stores::target::{self, Footprint, Target};

/// The memory store's rows: raw `insert` + `swap`, and `execute`.
#[derive(Debug, Default)]
pub(crate) struct MemoryBench;

#[async_trait]
impl Bench for MemoryBench {
    fn store(&self) -> &'static str {
        "memory"
    }

    fn contestants(&self) -> Vec<Contestant> {
        vec![
            Contestant {
                kind: Kind::Raw,
                make: Box::new(|| Arc::new(StoreRaw::new(MemoryStore::new())) as Arc<dyn Protocol>),
                fresh: true,
                round_trips: |_| 0,
            },
            Contestant {
                kind: Kind::Idem,
                make: Box::new(|| {
                    Arc::new(IdemRow::new(Idempotent::new(MemoryStore::new()))) as Arc<dyn Protocol>
                }),
                fresh: true,
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
        let mut section = String::from(
            "memory store: execute overhead per call over raw insert+swap \
             (median over repetitions of the p50 difference; mean from ops/s)",
        );
        let mut lines = Vec::new();
        for idem in report
            .rows
            .iter()
            .filter(|r| r.store == "memory" && r.kind == Kind::Idem && r.concurrency == 1)
        {
            let Some(raw) = report.peer(idem, Kind::Raw) else {
                continue;
            };
            let p50: Vec<f64> = idem
                .reps
                .iter()
                .zip(&raw.reps)
                .map(|(i, r)| i.p50_us - r.p50_us)
                .collect();
            let mean: Vec<f64> = idem
                .reps
                .iter()
                .zip(&raw.reps)
                .map(|(i, r)| 1e6 / i.ops_per_sec - 1e6 / r.ops_per_sec)
                .collect();
            let (Some(p50), Some(mean)) = (stats::median(&p50), stats::median(&mean)) else {
                continue;
            };
            let _ = write!(
                section,
                "\n  {:<10} c1  overhead p50 {} µs, mean {} µs  (raw p50 {} µs, idem p50 {} µs)",
                idem.workload.name(),
                fixed(p50),
                fixed(mean),
                fixed(raw.summary.p50_us),
                fixed(idem.summary.p50_us),
            );
            lines.push(format!(
                "overhead memory {} c1 {p50:.3}",
                idem.workload.name()
            ));
        }
        if !lines.is_empty() {
            report.sections.push(section);
            report.lines.extend(lines);
        }
        Ok(())
    }
}

/// This process's resident memory, from `/proc/self/statm` (Linux).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The in-process store; its records are weighed by the process's resident
/// memory growth.
pub(crate) struct MemoryTarget {
    store: Arc<MemoryStore>,
    resident_at_open: u64,
}

impl MemoryTarget {
    pub(crate) fn new() -> MemoryTarget {
        MemoryTarget {
            store: Arc::new(MemoryStore::new()),
            resident_at_open: resident_bytes().unwrap_or(0),
        }
    }
}

#[async_trait]
impl Target for MemoryTarget {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        _template: &str,
        record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        target::fill_through_store(self.store.clone(), 64, prefix, record, from, to).await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let now = resident_bytes().ok_or("no /proc/self/statm to read resident memory from")?;
        Ok(Footprint {
            bytes: now.saturating_sub(self.resident_at_open),
            how: "the process's resident memory growth since the store opened".to_owned(),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        Ok(Some(self.store.len() as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        Ok(vec![format!("records held {}", self.store.len())])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        // Dropped with the target.
        Ok(())
    }

    fn clearing_batch(&self) -> usize {
        // Each purge call scans the map from its start, so clearing a
        // backlog in batches costs a scan per batch: one call, one scan.
        usize::MAX
    }
}
