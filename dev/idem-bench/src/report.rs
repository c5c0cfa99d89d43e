//! The report: a readable table, then one machine-readable line per figure.

use std::fmt::Write as _;

use crate::bench::Kind;
pub(crate) use crate::markdown::thousands;
use crate::markdown::Table;
use crate::runner::{Tally, Workload};
use crate::stats::{self, Summary};

/// One measured row: a protocol on a store, in one workload and concurrency.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) store: &'static str,
    pub(crate) workload: Workload,
    pub(crate) concurrency: usize,
    pub(crate) kind: Kind,
    /// The median of each figure over the repetitions.
    pub(crate) summary: Summary,
    /// Each repetition, in order.
    pub(crate) reps: Vec<Summary>,
    pub(crate) tally: Tally,
    /// Round trips per operation from the server's counters.
    pub(crate) round_trips: Option<f64>,
    /// Every counter that moved, per operation.
    pub(crate) breakdown: Option<String>,
    pub(crate) first_error: Option<String>,
    /// CPU time of the harness process per operation, in µs (median over
    /// repetitions): the client's cost, plus the store's for in-process
    /// stores and the server's in HTTP mode.
    pub(crate) cpu_us: Option<f64>,
}

impl Row {
    /// The one line printed as soon as the row is measured.
    pub(crate) fn progress_line(&self) -> String {
        let mut line = format!(
            "  {:<11} {:<10} c{:<3} {:<7} {:>11} ops/s  p50 {:>9} µs  p99 {:>9} µs",
            self.store,
            self.workload.name(),
            self.concurrency,
            self.kind.name(),
            thousands(self.summary.ops_per_sec),
            fixed(self.summary.p50_us),
            fixed(self.summary.p99_us),
        );
        let t = &self.tally;
        let _ = write!(
            line,
            "  [ran {} replayed {} in-progress {}",
            t.ran, t.replayed, t.in_progress
        );
        if t.errors > 0 {
            let _ = write!(line, " ERRORS {}", t.errors);
        }
        line.push(']');
        line
    }
}

/// Everything one invocation measured.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) rows: Vec<Row>,
    /// Store-specific sections (memory per record, HTTP), already formatted.
    pub(crate) sections: Vec<String>,
    /// Extra machine-readable lines, printed after the ratio lines.
    pub(crate) lines: Vec<String>,
    /// Stores skipped, and why.
    pub(crate) skipped: Vec<String>,
}

impl Report {
    /// The row of `kind` in the same cell as `row`.
    pub(crate) fn peer(&self, row: &Row, kind: Kind) -> Option<&Row> {
        self.rows.iter().find(|r| {
            r.store == row.store
                && r.workload == row.workload
                && r.concurrency == row.concurrency
                && r.kind == kind
        })
    }

    /// idem over its baseline (raw, or the HTTP control), by ops/s: the
    /// median of the per-repetition ratios, since each repetition ran both
    /// rows back to back.
    pub(crate) fn ratio(&self, idem: &Row) -> Option<f64> {
        let raw = self
            .peer(idem, Kind::Raw)
            .or_else(|| self.peer(idem, Kind::Control))?;
        paired_ratio(&idem.reps, &raw.reps)
    }

    /// The whole report as text.
    pub(crate) fn render(&self) -> String {
        let mut out = String::from(LEGEND);
        let _ = writeln!(
            out,
            "{:<11} {:<10} {:>4}  {:<7} {:>12} {:>10} {:>10} {:>9} {:>7} {:>7}",
            "store",
            "workload",
            "conc",
            "row",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "cpu µs/op",
            "rt/op",
            "ratio"
        );
        let _ = writeln!(out, "{}", "-".repeat(97));
        for row in &self.rows {
            let ratio = match row.kind {
                Kind::Idem | Kind::IdemNear => self.ratio(row).map(|r| format!("{r:.2}")),
                Kind::IdemTx => self
                    .peer(row, Kind::RawTx)
                    .and_then(|raw| paired_ratio(&row.reps, &raw.reps))
                    .map(|r| format!("{r:.2}")),
                Kind::Blog | Kind::Single | Kind::Timed => self
                    .peer(row, Kind::Raw)
                    .and_then(|raw| paired_ratio(&row.reps, &raw.reps))
                    .map(|r| format!("({r:.2})")),
                // Against `idem` in the same run: what three steps cost.
                Kind::IdemSteps => self
                    .peer(row, Kind::Idem)
                    .and_then(|idem| paired_ratio(&row.reps, &idem.reps))
                    .map(|r| format!("[{r:.2}]")),
                Kind::Raw | Kind::Control | Kind::RawTx => None,
            };
            let _ = writeln!(
                out,
                "{:<11} {:<10} {:>4}  {:<7} {:>12} {:>10} {:>10} {:>9} {:>7} {:>7}{}",
                row.store,
                row.workload.name(),
                format!("c{}", row.concurrency),
                row.kind.name(),
                thousands(row.summary.ops_per_sec),
                fixed(row.summary.p50_us),
                fixed(row.summary.p99_us),
                row.cpu_us.map_or("-".to_owned(), fixed),
                row.round_trips
                    .map_or("-".to_owned(), |r| format!("{r:.2}")),
                ratio.unwrap_or_default(),
                match (&row.first_error, row.tally.errors) {
                    (Some(e), n) => format!("  {n} errors, first: {e}"),
                    _ => String::new(),
                },
            );
        }
        let counted: Vec<&Row> = self.rows.iter().filter(|r| r.breakdown.is_some()).collect();
        if !counted.is_empty() {
            let _ = writeln!(
                out,
                "\nserver counters per operation (all clients of the server):"
            );
            for row in counted {
                let _ = writeln!(
                    out,
                    "  {:<11} {:<10} c{:<3} {:<7} {}",
                    row.store,
                    row.workload.name(),
                    row.concurrency,
                    row.kind.name(),
                    row.breakdown.as_deref().unwrap_or_default()
                );
            }
        }
        for section in &self.sections {
            let _ = writeln!(out, "\n{section}");
        }
        for skipped in &self.skipped {
            let _ = writeln!(out, "\nskipped: {skipped}");
        }
        let _ = writeln!(out);
        for line in self.machine_lines() {
            let _ = writeln!(out, "{line}");
        }
        out
    }

    /// `ratio <store> <workload> c<N> <value>` per cell, `roundtrips ...`
    /// per counted row, then the extra lines.
    pub(crate) fn machine_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for row in self.rows.iter().filter(|r| r.kind == Kind::Idem) {
            if let Some(r) = self.ratio(row) {
                lines.push(format!(
                    "ratio {} {} c{} {r:.3}",
                    row.store,
                    row.workload.name(),
                    row.concurrency
                ));
            }
        }
        for row in self.rows.iter().filter(|r| r.kind == Kind::Idem) {
            let timed = self.peer(row, Kind::Timed);
            if let Some(r) = timed.and_then(|t| paired_ratio(&row.reps, &t.reps)) {
                lines.push(format!(
                    "ratio-ttl {} {} c{} {r:.3}",
                    row.store,
                    row.workload.name(),
                    row.concurrency
                ));
            }
        }
        // The near cache against the baseline and against `idem` uncached.
        for row in self.rows.iter().filter(|r| r.kind == Kind::IdemNear) {
            let idem = self.peer(row, Kind::Idem);
            if let (Some(base), Some(uncached)) = (
                self.ratio(row),
                idem.and_then(|i| paired_ratio(&row.reps, &i.reps)),
            ) {
                lines.push(format!(
                    "ratio-near {} {} c{} {base:.3} vs-idem {uncached:.3}",
                    row.store,
                    row.workload.name(),
                    row.concurrency
                ));
            }
        }
        for row in &self.rows {
            if let Some(rt) = row.round_trips {
                lines.push(format!(
                    "roundtrips {} {} c{} {} {rt:.2}",
                    row.store,
                    row.workload.name(),
                    row.concurrency,
                    row.kind.name()
                ));
            }
        }
        lines.extend(self.lines.iter().cloned());
        lines
    }
}

impl Report {
    /// The headline table of `BENCHMARKS.md`: per store, workload and
    /// concurrency, idem against the raw protocol (and the unsafe recipe
    /// against raw where a store has one). Median ops/s over repetitions;
    /// the ratio is the median of the per-repetition ratios.
    pub(crate) fn markdown_results(&self) -> String {
        let recipes = self.rows.iter().any(|r| r.kind == Kind::Blog);
        let mut columns = vec![
            "store",
            "workload",
            ">callers",
            ">idem ops/s",
            ">raw ops/s",
            ">idem ÷ raw",
            ">round trips, idem (raw)",
            ">idem p99 µs",
        ];
        if recipes {
            columns.push(">unsafe recipe ÷ raw");
        }
        let mut table = Table::new(&columns);
        for idem in self.rows.iter().filter(|r| r.kind == Kind::Idem) {
            if idem.store.starts_with("http-") {
                continue;
            }
            let Some(raw) = self.peer(idem, Kind::Raw) else {
                continue;
            };
            let trips = |row: &Row| {
                row.round_trips
                    .map_or("-".to_owned(), |r| format!("{r:.2}"))
            };
            let mut cells = vec![
                idem.store.to_owned(),
                idem.workload.name().to_owned(),
                idem.concurrency.to_string(),
                thousands(idem.summary.ops_per_sec),
                thousands(raw.summary.ops_per_sec),
                self.ratio(idem)
                    .map_or("-".to_owned(), |r| format!("{r:.2}")),
                format!("{} ({})", trips(idem), trips(raw)),
                fixed(idem.summary.p99_us),
            ];
            if recipes {
                cells.push(
                    self.peer(idem, Kind::Blog)
                        .and_then(|blog| paired_ratio(&blog.reps, &raw.reps))
                        .map_or(String::new(), |r| format!("{r:.2}")),
                );
            }
            table.row(cells);
        }
        table.render()
    }

    /// The HTTP layer's table: requests/s through the layer against the
    /// same app without it, per backend, workload and concurrency.
    pub(crate) fn markdown_http(&self) -> String {
        let mut table = Table::new(&[
            "backend",
            "workload",
            ">connections",
            ">layer req/s",
            ">plain req/s",
            ">layer ÷ plain",
            ">layer p99 µs",
        ]);
        for idem in self.rows.iter().filter(|r| r.kind == Kind::Idem) {
            let Some(backend) = idem.store.strip_prefix("http-") else {
                continue;
            };
            let Some(control) = self.peer(idem, Kind::Control) else {
                continue;
            };
            table.row(vec![
                backend.to_owned(),
                idem.workload.name().to_owned(),
                idem.concurrency.to_string(),
                thousands(idem.summary.ops_per_sec),
                thousands(control.summary.ops_per_sec),
                self.ratio(idem)
                    .map_or("-".to_owned(), |r| format!("{r:.2}")),
                fixed(idem.summary.p99_us),
            ]);
        }
        table.render()
    }

    /// The near cache's rows of `BENCHMARKS.md`, for merging by their first
    /// two cells: `execute` replays with and without the cache, and the
    /// HTTP replay's ratios to the bare handler. `None` without `idem-near`
    /// rows.
    pub(crate) fn markdown_near(&self) -> Option<Table> {
        let mut table = Table::new(&[
            "path",
            ">callers",
            ">without cache",
            ">with cache",
            ">with ÷ without",
        ]);
        // Replays only: the cache keeps settled records, so a first call
        // goes to the store as it would without it.
        let replays = |r: &&Row| r.kind == Kind::IdemNear && r.workload == Workload::Replay;
        for near in self.rows.iter().filter(replays) {
            let Some(idem) = self.peer(near, Kind::Idem) else {
                continue;
            };
            let gain = paired_ratio(&near.reps, &idem.reps);
            let times = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.2}×"));
            let row = if near.store.starts_with("http-") {
                [
                    "HTTP replay (axum), ÷ a bare handler making one Redis `GET`".to_owned(),
                    times(self.ratio(idem)),
                    times(self.ratio(near)),
                    gain.map_or("-".to_owned(), |r| format!("{r:.2}")),
                ]
            } else {
                [
                    format!("`execute` {}, ops/s", near.workload.name()),
                    thousands(idem.summary.ops_per_sec),
                    thousands(near.summary.ops_per_sec),
                    gain.map_or("-".to_owned(), |r| format!("{r:.1}")),
                ]
            };
            let [path, without, with, gain] = row;
            table.row(vec![
                path,
                near.concurrency.to_string(),
                without,
                with,
                gain,
            ]);
        }
        (!table.is_empty()).then_some(table)
    }
}

/// What the rows and columns mean, printed above the table.
const LEGEND: &str = "\
rows: raw      the minimal correct protocol by hand (one-round-trip claim, one-round-trip
               compare-and-set completion), same client and thread model as the store
      blog     Redis only: SET NX, GET on a duplicate, plain SET to complete (unfenced)
      raw-1tx  SQLite only: raw with one transaction per operation (no group commit)
      raw-ttl  Redis only: raw whose claim also reads PTTL in the same MULTI ... EXEC,
               every call (idem reads it only for a record found in flight)
      control  HTTP only: the same axum app without the layer, one plain store call
      idem     Idempotent::execute (HTTP: IdempotencyLayer), 100-byte body and outcome
columns: median over repetitions; cpu µs/op = CPU of this process per operation (client,
      plus the store or server when in-process); rt/op = round trips per operation from the
      server's counters; ratio = idem ÷ raw (HTTP: ÷ control) by ops/s, median of the
      per-repetition ratios; (x) = the reference row ÷ raw; ratio-ttl lines = idem ÷
      raw-ttl.

";

/// The median of `a[i] / b[i]` by ops/s over paired repetitions.
pub(crate) fn paired_ratio(a: &[Summary], b: &[Summary]) -> Option<f64> {
    let ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(a, b)| stats::ratio(a.ops_per_sec, b.ops_per_sec))
        .collect();
    stats::median(&ratios)
}

/// A latency with precision that suits its size.
pub(crate) fn fixed(us: f64) -> String {
    match us {
        us if !us.is_finite() => "-".to_owned(),
        us if us < 10.0 => format!("{us:.2}"),
        us if us < 1000.0 => format!("{us:.1}"),
        us => format!("{us:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ops: f64) -> Summary {
        Summary {
            ops_per_sec: ops,
            p50_us: 1.0,
            p99_us: 2.0,
        }
    }

    #[test]
    fn paired_ratio_is_the_median_of_repetition_ratios() {
        let idem = [s(90.0), s(50.0), s(100.0)];
        let raw = [s(100.0), s(100.0), s(100.0)];
        assert_eq!(paired_ratio(&idem, &raw), Some(0.9));
        assert_eq!(paired_ratio(&idem, &[]), None);
    }

    fn row(kind: Kind, ops: [f64; 3]) -> Row {
        Row {
            store: "redis",
            workload: Workload::Replay,
            concurrency: 32,
            kind,
            summary: s(ops[1]),
            reps: ops.into_iter().map(s).collect(),
            tally: Tally::default(),
            round_trips: Some(1.0),
            breakdown: None,
            first_error: None,
            cpu_us: None,
        }
    }

    #[test]
    fn idem_is_compared_with_raw_and_with_the_timed_claim() {
        let report = Report {
            rows: vec![
                row(Kind::Raw, [200.0, 200.0, 200.0]),
                row(Kind::Timed, [100.0, 140.0, 120.0]),
                row(Kind::Idem, [100.0, 120.0, 120.0]),
            ],
            ..Report::default()
        };
        let lines = report.machine_lines();
        assert_eq!(lines[0], "ratio redis replay c32 0.600");
        assert_eq!(lines[1], "ratio-ttl redis replay c32 1.000");
        let table = report.render();
        assert!(
            table.contains("raw-ttl") && table.contains("(0.60)"),
            "{table}"
        );
    }

    #[test]
    fn the_markdown_table_has_a_line_per_cell_with_idem_against_raw() {
        let report = Report {
            rows: vec![
                row(Kind::Raw, [200.0, 200.0, 200.0]),
                row(Kind::Blog, [300.0, 300.0, 300.0]),
                row(Kind::Idem, [100.0, 120.0, 120.0]),
            ],
            ..Report::default()
        };
        let table = report.markdown_results();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert_eq!(
            lines[2],
            "| redis | replay | 32 | 120 | 200 | 0.60 | 1.00 (1.00) | 2.00 | 1.50 |"
        );
        assert!(report.markdown_http().lines().count() == 2);
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(f64::NAN), "-");
        assert_eq!(fixed(1.234), "1.23");
        assert_eq!(fixed(123.45), "123.5");
        assert_eq!(fixed(12345.6), "12346");
    }
}
