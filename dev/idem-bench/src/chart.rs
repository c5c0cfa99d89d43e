//! The PNG chart: one panel per store, ops/s per workload and concurrency,
//! one bar per row.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::bench::Kind;
use crate::fixture::BoxError;
use crate::report::{Report, Row};
use crate::runner::Workload;

const FONT: &str = "sans-serif";
const PANEL_HEIGHT: u32 = 420;
const WIDTH: u32 = 1500;

fn color(kind: Kind) -> RGBColor {
    match kind {
        Kind::Raw => RGBColor(150, 150, 150),
        Kind::Control => RGBColor(150, 150, 150),
        Kind::Blog => RGBColor(230, 150, 60),
        Kind::Single => RGBColor(110, 170, 110),
        Kind::Timed => RGBColor(110, 110, 110),
        Kind::Idem => RGBColor(40, 100, 200),
        Kind::RawTx => RGBColor(120, 120, 160),
        Kind::IdemTx => RGBColor(40, 160, 200),
        Kind::IdemSteps => RGBColor(120, 60, 180),
        Kind::IdemNear => RGBColor(200, 60, 60),
    }
}

/// Draws the report's rows into a PNG at `path`.
pub(crate) fn draw(report: &Report, path: &Path) -> Result<(), BoxError> {
    // The font travels inside the binary: no system font library needed.
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the bundled font does not load")?;
    let mut stores: Vec<&'static str> = Vec::new();
    for row in &report.rows {
        if !stores.contains(&row.store) {
            stores.push(row.store);
        }
    }
    if stores.is_empty() {
        return Err("nothing was measured, so there is nothing to chart".into());
    }
    let grid_rows = stores.len().div_ceil(2);
    let height = 70 + PANEL_HEIGHT * grid_rows as u32;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(70);
    title.draw(&Text::new(
        "idem vs the raw protocol on the same server: ops/s, median of repetitions (×N above a group: idem ÷ raw, or ÷ control over HTTP)",
        (20, 22),
        (FONT, 24).into_font(),
    ))?;
    let panels = body.split_evenly((grid_rows, 2));
    for (panel, store) in panels.iter().zip(&stores) {
        let rows: Vec<&Row> = report.rows.iter().filter(|r| r.store == *store).collect();
        draw_panel(panel, store, &rows, report)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    store: &str,
    rows: &[&Row],
    report: &Report,
) -> Result<(), BoxError>
where
    DB::ErrorType: 'static,
{
    let mut cells: Vec<(Workload, usize)> = Vec::new();
    let mut kinds: Vec<Kind> = Vec::new();
    for row in rows {
        if !cells.contains(&(row.workload, row.concurrency)) {
            cells.push((row.workload, row.concurrency));
        }
        if !kinds.contains(&row.kind) {
            kinds.push(row.kind);
        }
    }
    kinds.sort();
    let top = rows
        .iter()
        .map(|r| r.summary.ops_per_sec)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.18;
    let labels: Vec<String> = cells
        .iter()
        .map(|(w, c)| format!("{} c{c}", w.name()))
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(store, (FONT, 22))
        .margin(12)
        .x_label_area_size(34)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..cells.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cells.len() * 2 + 1)
        .x_label_formatter(&|x| {
            // Ticks fall on the half-steps; the centre of each group is
            // labelled, the edges are not.
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 0.01 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| short(*y))
        .y_desc("ops/s")
        .light_line_style(RGBColor(238, 238, 238))
        .label_style((FONT, 14))
        .draw()?;
    let width = 0.8 / kinds.len() as f64;
    for (k, &kind) in kinds.iter().enumerate() {
        let bars: Vec<(f64, f64, f64)> = cells
            .iter()
            .enumerate()
            .filter_map(|(i, &(w, c))| {
                let row = rows
                    .iter()
                    .find(|r| r.workload == w && r.concurrency == c && r.kind == kind)?;
                let left = i as f64 + 0.1 + k as f64 * width;
                Some((left, left + width * 0.92, row.summary.ops_per_sec))
            })
            .collect();
        let fill = color(kind);
        chart.draw_series(
            bars.iter()
                .map(|&(l, r, v)| Rectangle::new([(l, 0.0), (r, v)], fill.filled())),
        )?;
        // The legend sits on the caption's line, clear of every bar.
        let (w, _) = area.dim_in_pixel();
        let x = w as i32 - 80 * (kinds.len() - k) as i32;
        area.draw(&Rectangle::new([(x, 10), (x + 14, 24)], fill.filled()))?;
        area.draw(&Text::new(kind.name(), (x + 20, 10), (FONT, 14)))?;
        chart.draw_series(bars.iter().map(|&(l, r, v)| {
            Text::new(
                short(v),
                ((l + r) / 2.0 - width * 0.3, v + top * 0.045),
                (FONT, 11),
            )
        }))?;
    }
    // The ratio over each idem bar's cell, where there is one.
    chart.draw_series(
        rows.iter()
            .filter(|r| r.kind == Kind::Idem)
            .filter_map(|row| {
                let ratio = report.ratio(row)?;
                let i = cells
                    .iter()
                    .position(|&c| c == (row.workload, row.concurrency))?;
                Some(Text::new(
                    format!("×{ratio:.2}"),
                    (i as f64 + 0.35, top * 0.97),
                    (FONT, 13).into_font().color(&color(Kind::Idem)),
                ))
            }),
    )?;
    Ok(())
}

/// 1234567 as "1.2M", 12345 as "12.3k".
fn short(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.0}k", v / 1e3),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}
