//! The in-process `MemoryStore`: idem's own overhead, with no I/O to hide it.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::{Idempotent, MemoryStore};

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::BoxError;
use crate::protocols::{IdemRow, StoreRaw};
use crate::report::{fixed, Report};
use crate::runner::Protocol;
use crate::stats;

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
