//! The scale mode's report: cells, growth against the smallest size, bytes
//! per record, purge at steady state, and a text chart of latency against
//! record count.

use std::fmt::Write as _;

use crate::runner::Workload;

use super::{Cell, Churned, ScaleReport, Weighed};

/// The latency growth the issue sets as the target at the largest size.
pub(crate) const GROWTH_TARGET: f64 = 1.25;
/// The purge headroom over ingest the issue sets as the target.
pub(crate) const HEADROOM_TARGET: f64 = 2.0;
/// The claim p99 with purging against without, as the target.
pub(crate) const PURGE_P99_TARGET: f64 = 1.5;

/// `1m`, `10k`, `100000` as a short count.
pub(crate) fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}m", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// The progress line of one cell.
pub(crate) fn cell_line(c: &Cell) -> String {
    let size = if c.size == c.alongside {
        count(c.size)
    } else {
        format!("{}@{}", count(c.size), count(c.alongside))
    };
    let mut line = format!(
        "scale {:<8} {:>9} {:<6} c{:<3} {:>9.0} ops/s  p50 {:>8.1} µs  p99 {:>8.1} µs",
        c.store,
        size,
        c.workload.name(),
        c.concurrency,
        c.summary.ops_per_sec,
        c.summary.p50_us,
        c.summary.p99_us,
    );
    if c.tally.errors > 0 {
        let _ = write!(
            line,
            "  {} errors, first: {}",
            c.tally.errors,
            c.first_error.as_deref().unwrap_or("?")
        );
    }
    line
}

/// The whole report as text.
pub(crate) fn render(report: &ScaleReport) -> String {
    let mut out = String::new();
    for line in &report.skipped {
        let _ = writeln!(out, "skipped {line}");
    }
    let _ = writeln!(out, "# latency at each size (medians of repetitions)");
    for cell in &report.cells {
        let _ = writeln!(out, "{}", cell_line(cell));
    }
    let _ = writeln!(
        out,
        "# growth: latency at each size ÷ latency at the smallest (target ≤ {GROWTH_TARGET} at the largest)"
    );
    for cell in report.cells.iter().filter(|c| c.size == c.alongside) {
        // The baseline store's cell of the same repetitions.
        let Some(base) = report.cells.iter().find(|b| {
            b.store == cell.store
                && b.workload == cell.workload
                && b.concurrency == cell.concurrency
                && b.alongside == cell.alongside
                && b.size < cell.size
        }) else {
            continue;
        };
        let p50 = cell.summary.p50_us / base.summary.p50_us;
        let p99 = cell.summary.p99_us / base.summary.p99_us;
        let largest = report
            .cells
            .iter()
            .filter(|c| c.store == cell.store)
            .map(|c| c.size)
            .max()
            == Some(cell.size);
        let verdict = if !largest {
            ""
        } else if p50 <= GROWTH_TARGET && p99 <= GROWTH_TARGET {
            "  meets"
        } else {
            "  misses"
        };
        let _ = writeln!(
            out,
            "growth {} {} c{} {}/{} p50 {p50:.2} p99 {p99:.2}{verdict}",
            cell.store,
            cell.workload.name(),
            cell.concurrency,
            count(cell.size),
            count(base.size),
        );
    }
    let _ = writeln!(out, "# bytes per record");
    for s in &report.sizes {
        let _ = writeln!(out, "{}", bytes_line(s));
    }
    let _ = writeln!(out, "# purge at scale");
    for c in &report.churns {
        out.push_str(&churn_lines(c));
    }
    out.push_str(&chart(report));
    out
}

pub(crate) fn bytes_line(s: &Weighed) -> String {
    let per = s.footprint.bytes as f64 / s.size as f64;
    format!(
        "bytes {} {} per-record {per:.0} raw-record {} ratio {:.2} records-per-gb {:.0} fill {:.1} s ({:.0}/s); {}",
        s.store,
        count(s.size),
        s.raw_record,
        per / s.raw_record as f64,
        1e9 / per,
        s.fill.as_secs_f64(),
        s.size as f64 / s.fill.as_secs_f64().max(1e-9),
        s.footprint.how,
    )
}

pub(crate) fn churn_lines(c: &Churned) -> String {
    let mut out = String::new();
    let steady_secs = c.churn.window.as_secs_f64();
    let ingest = c.steady.summary.ops_per_sec;
    let purge_rate = c.purged as f64 / steady_secs;
    let capacity = if c.purge_busy > 0.0 {
        c.purged as f64 / c.purge_busy
    } else {
        f64::NAN
    };
    let headroom = capacity / ingest;
    let p99 = c.steady.summary.p99_us / c.baseline.summary.p99_us;
    let _ = writeln!(
        out,
        "churn {} on {} records: {} first executions/s asked, {:.0} achieved; retention {:.1} s, purge every {:.1} s in batches of {}{}, churned {:.0} s",
        c.store,
        count(c.bulk),
        c.churn.rate,
        ingest,
        c.churn.retention.as_secs_f64(),
        c.churn.every.as_secs_f64(),
        c.churn.batch,
        if c.churn.purge { "" } else { " (purger off: a control run)" },
        c.churned_for.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "purge {} purged {} in {steady_secs:.0} s ({purge_rate:.0}/s) with {} calls busy {:.2} s: capacity {capacity:.0}/s, headroom {headroom:.1}× ({})",
        c.store,
        c.purged,
        c.purge_calls,
        c.purge_busy,
        if !c.churn.purge {
            "the purger was off".to_owned()
        } else if c.store == "redis" {
            "the server expires keys itself".to_owned()
        } else if headroom >= HEADROOM_TARGET {
            format!("meets ≥ {HEADROOM_TARGET}×")
        } else {
            format!("misses ≥ {HEADROOM_TARGET}×")
        },
    );
    let _ = writeln!(
        out,
        "claim-p99 {} no-purge {:.1} µs (p50 {:.1}) with-purge {:.1} µs (p50 {:.1}) ratio {p99:.2} ({} ≤ {PURGE_P99_TARGET}×)",
        c.store,
        c.baseline.summary.p99_us,
        c.baseline.summary.p50_us,
        c.steady.summary.p99_us,
        c.steady.summary.p50_us,
        if p99 <= PURGE_P99_TARGET { "meets" } else { "misses" },
    );
    let (during, apart, (calls, purge, longest)) =
        (c.split.during, c.split.apart, c.split.purge_calls);
    let _ = writeln!(
        out,
        "claim-split {} beside-a-purge {} claims p50 {:.1} p99 {:.1} µs; apart {} claims p50 {:.1} p99 {:.1} µs; purge calls {calls} p50 {:.1} p99 {:.1} longest {longest:.1} µs",
        c.store,
        during.0,
        during.1.p50_us,
        during.1.p99_us,
        apart.0,
        apart.1.p50_us,
        apart.1.p99_us,
        purge.p50_us,
        purge.p99_us,
    );
    if let Some(held) = c.held {
        let _ = writeln!(
            out,
            "steady {} churn records held {held} (ingest × retention = {:.0})",
            c.store,
            ingest * c.churn.retention.as_secs_f64()
        );
    }
    for note in &c.notes {
        let _ = writeln!(out, "after-churn {} {note}", c.store);
    }
    if c.purge_errors > 0 || c.steady.tally.errors + c.baseline.tally.errors > 0 {
        let _ = writeln!(
            out,
            "errors {} purge {} ({}) ingest {} ({})",
            c.store,
            c.purge_errors,
            c.purge_error.as_deref().unwrap_or("-"),
            c.steady.tally.errors + c.baseline.tally.errors,
            c.steady
                .first_error
                .as_deref()
                .or(c.baseline.first_error.as_deref())
                .unwrap_or("-"),
        );
    }
    out
}

/// p50 against record count at the lowest concurrency: one bar per store,
/// workload and size, each store's bars to its own scale (the baseline
/// size from its first pairing).
fn chart(report: &ScaleReport) -> String {
    let mut out = String::new();
    let Some(&lowest) = report.cells.iter().map(|c| &c.concurrency).min() else {
        return out;
    };
    let _ = writeln!(
        out,
        "# chart: p50 µs at c{lowest} against records held (each store and workload to its own scale)"
    );
    let mut stores: Vec<&str> = Vec::new();
    for c in &report.cells {
        if !stores.contains(&c.store) {
            stores.push(c.store);
        }
    }
    for workload in [Workload::First, Workload::Replay] {
        for store in &stores {
            let mut bars: Vec<&Cell> = Vec::new();
            for c in report
                .cells
                .iter()
                .filter(|c| c.store == *store && c.workload == workload && c.concurrency == lowest)
            {
                if !bars.iter().any(|b| b.size == c.size) {
                    bars.push(c);
                }
            }
            bars.sort_by_key(|c| c.size);
            let widest = bars
                .iter()
                .map(|c| c.summary.p50_us)
                .fold(0.0_f64, f64::max);
            for (i, c) in bars.iter().enumerate() {
                let bar = if widest > 0.0 {
                    (c.summary.p50_us / widest * 40.0).round() as usize
                } else {
                    0
                };
                let label = if i == 0 { *store } else { "" };
                let _ = writeln!(
                    out,
                    "{:<6} {label:<8} {:>5} {:<40} {:.1}",
                    workload.name(),
                    count(c.size),
                    "█".repeat(bar.max(1)),
                    c.summary.p50_us
                );
            }
        }
    }
    out
}

/// The scale table of `BENCHMARKS.md`: per store at its largest size,
/// p50 growth against the smallest size at the lowest concurrency, bytes
/// per record, and what the purger costs the claims beside it.
pub(crate) fn markdown(report: &ScaleReport) -> String {
    let mut table = crate::markdown::Table::new(&[
        "store",
        ">records",
        ">first p50 growth",
        ">replay p50 growth",
        ">bytes per record",
        ">records per GB",
        ">purge headroom",
        ">claim p99, purging ÷ not",
    ]);
    let lowest = report.cells.iter().map(|c| c.concurrency).min();
    for weighed in &report.sizes {
        let largest = report
            .sizes
            .iter()
            .filter(|s| s.store == weighed.store)
            .map(|s| s.size)
            .max();
        if largest != Some(weighed.size) {
            continue;
        }
        let growth = |workload: Workload| {
            let cell = report.cells.iter().find(|c| {
                c.store == weighed.store
                    && c.size == weighed.size
                    && c.size == c.alongside
                    && c.workload == workload
                    && Some(c.concurrency) == lowest
            })?;
            let base = report.cells.iter().find(|b| {
                b.store == cell.store
                    && b.workload == cell.workload
                    && b.concurrency == cell.concurrency
                    && b.alongside == cell.alongside
                    && b.size < cell.size
            })?;
            Some(format!(
                "{:.2} (vs {})",
                cell.summary.p50_us / base.summary.p50_us,
                count(base.size)
            ))
        };
        let per = weighed.footprint.bytes as f64 / weighed.size as f64;
        let churn = report.churns.iter().find(|c| c.store == weighed.store);
        let headroom = churn.map_or("-".to_owned(), |c| {
            if c.store == "redis" {
                "server expires".to_owned()
            } else if c.purge_busy > 0.0 {
                let capacity = c.purged as f64 / c.purge_busy;
                format!("{:.1}×", capacity / c.steady.summary.ops_per_sec)
            } else {
                "-".to_owned()
            }
        });
        let p99 = churn.map_or("-".to_owned(), |c| {
            format!("{:.2}", c.steady.summary.p99_us / c.baseline.summary.p99_us)
        });
        table.row(vec![
            weighed.store.to_owned(),
            count(weighed.size),
            growth(Workload::First).unwrap_or_else(|| "-".to_owned()),
            growth(Workload::Replay).unwrap_or_else(|| "-".to_owned()),
            format!("{per:.0}"),
            crate::report::thousands(1e9 / per),
            headroom,
            p99,
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_print_short() {
        assert_eq!(count(10_000), "10k");
        assert_eq!(count(1_000_000), "1m");
        assert_eq!(count(12_345), "12345");
        assert_eq!(count(100_000), "100k");
    }
}
