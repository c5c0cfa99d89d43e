//! The rates page: first executions, replays, 409s, 422s and store errors
//! per minute over the last hour, charted as server-rendered SVG.
//!
//! The console scrapes an application's Prometheus endpoint (`--metrics
//! URL`, the text format every Prometheus exporter serves) at a fixed
//! interval and keeps the last hour of samples in memory. A minute's rate
//! is the increase of each counter, summed over its labels, between the
//! samples that end in that minute; a counter that went down was reset (the
//! application restarted), so its new value is the increase, as Prometheus
//! reads counters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup, PreEscaped};

use super::pages::page;
use super::Console;

/// The series charted: a label, the counter idem exports, and a colour.
const SERIES: [(&str, &str, &str); 5] = [
    ("First executions", "idem_executed_total", "#2b6cb0"),
    ("Replays", "idem_replayed_total", "#2f855a"),
    ("409 in progress", "idem_in_progress_total", "#b7791f"),
    ("422 mismatch", "idem_mismatch_total", "#c05621"),
    ("Store errors", "idem_store_errors_total", "#c53030"),
];

/// Minutes charted.
const MINUTES: u64 = 60;

/// One scrape: when, and each series' counters summed.
#[derive(Clone, Copy)]
struct Sample {
    at: u64,
    values: [f64; 5],
}

/// The scraper's memory.
pub(super) struct Rates {
    url: String,
    every: Duration,
    samples: Mutex<VecDeque<Sample>>,
    last_error: Mutex<Option<String>>,
}

impl Rates {
    /// Starts scraping `url` every `every`.
    pub(super) fn start(url: String, every: Duration) -> Result<Arc<Rates>, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the metrics client: {e}"))?;
        let rates = Arc::new(Rates {
            url,
            every,
            samples: Mutex::new(VecDeque::new()),
            last_error: Mutex::new(None),
        });
        let scraper = Arc::clone(&rates);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(scraper.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                scraper.scrape(&client).await;
            }
        });
        Ok(rates)
    }

    async fn scrape(&self, client: &reqwest::Client) {
        let answer = async {
            let response = client
                .get(&self.url)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("it answered {}", response.status()));
            }
            response.text().await.map_err(|e| e.to_string())
        }
        .await;
        match answer {
            Ok(text) => {
                let sample = Sample {
                    at: now(),
                    values: parse(&text),
                };
                let mut samples = lock(&self.samples);
                samples.push_back(sample);
                while samples
                    .front()
                    .is_some_and(|s| s.at + (MINUTES + 1) * 60 < sample.at)
                {
                    samples.pop_front();
                }
                *lock(&self.last_error) = None;
            }
            Err(error) => *lock(&self.last_error) = Some(error),
        }
    }

    /// Each series' increase per minute, oldest minute first, ending with
    /// the current one.
    fn per_minute(&self) -> (usize, [Vec<f64>; 5]) {
        let samples: Vec<Sample> = lock(&self.samples).iter().copied().collect();
        let mut buckets: [Vec<f64>; 5] = std::array::from_fn(|_| vec![0.0; MINUTES as usize]);
        let current = now() / 60;
        for pair in samples.windows(2) {
            let minute = pair[1].at / 60;
            let Some(back) = current.checked_sub(minute).filter(|b| *b < MINUTES) else {
                continue;
            };
            let at = (MINUTES - 1 - back) as usize;
            for (series, bucket) in buckets.iter_mut().enumerate() {
                let (before, after) = (pair[0].values[series], pair[1].values[series]);
                bucket[at] += if after >= before {
                    after - before
                } else {
                    after
                };
            }
        }
        (samples.len(), buckets)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Each series' counters in a Prometheus text exposition, summed over
/// their labels. Lines that are not samples of these counters are skipped.
fn parse(text: &str) -> [f64; 5] {
    let mut values = [0.0; 5];
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let Some(series) = SERIES
            .iter()
            .position(|(_, name, _)| *name == &line[..name_end])
        else {
            continue;
        };
        // The value follows the labels (which may hold spaces in quotes).
        let rest = match line[name_end..].strip_prefix('{') {
            Some(labels) => labels.rsplit_once('}').map_or("", |(_, rest)| rest),
            None => &line[name_end..],
        };
        if let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite())
        {
            values[series] += value;
        }
    }
    values
}

/// The rates page.
pub(super) fn show(console: &Console) -> Response {
    let Some(rates) = &console.rates else {
        let body = html! {
            p { "No metrics: start the console with --metrics URL, an application's Prometheus endpoint (such as http://127.0.0.1:9000/metrics), to chart its rates." }
        };
        return page(console, StatusCode::NOT_FOUND, "Rates", body);
    };
    let (kept, buckets) = rates.per_minute();
    let error = lock(&rates.last_error).clone();
    let body = html! {
        p.note {
            "Scraping " code { (rates.url) } " every " (rates.every.as_secs()) " s; "
            span #samples { (kept) } " samples kept. Per minute, over the last hour; the last bar is the current minute."
        }
        @if let Some(error) = error { p.error { "The last scrape failed: " (error) } }
        table #totals {
            tr { th { "series" } th { "counter" } th { "last hour" } th { "this minute" } th { "per minute, last hour" } }
            @for (at, (label, name, colour)) in SERIES.iter().enumerate() {
                tr {
                    td { (label) } td { code { (name) } }
                    td.total data-series=(name) { (number(buckets[at].iter().sum())) }
                    td { (number(buckets[at].last().copied().unwrap_or(0.0))) }
                    td { (chart(&buckets[at], colour, label)) }
                }
            }
        }
    };
    page(console, StatusCode::OK, "Rates", body)
}

/// `3`, or `2.5` for a fraction.
fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// One series as bars, one a minute, scaled to its own highest minute.
fn chart(values: &[f64], colour: &str, label: &str) -> Markup {
    let (width, height, bar) = (360.0, 48.0, 6.0);
    let top = values.iter().copied().fold(0.0, f64::max);
    let mut bars = String::new();
    for (at, value) in values.iter().enumerate() {
        if *value > 0.0 {
            let h = (value / top * (height - 2.0)).max(1.0);
            bars.push_str(&format!(
                "<rect x=\"{:.0}\" y=\"{:.1}\" width=\"{:.0}\" height=\"{h:.1}\"><title>{} a minute</title></rect>",
                at as f64 * bar,
                height - h,
                bar - 1.0,
                number(*value),
            ));
        }
    }
    html! {
        svg width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } role="img"
            aria-label={ (label) " per minute, highest " (number(top)) } fill=(colour) {
            // Closed: inside SVG, HTML's parser treats `<line>` as open
            // until its end tag, and would hide the bars within it.
            line x1="0" y1=(height - 0.5) x2=(width) y2=(height - 0.5) stroke="#ccc" {}
            (PreEscaped(bars))
        }
        " max " (number(top))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_counters_over_labels() {
        let text = "# TYPE idem_executed_total counter\n\
            idem_executed_total{store=\"sqlite\",namespace=\"a b\"} 3\n\
            idem_executed_total{store=\"pg\",namespace=\"x\"} 4 1700000000000\n\
            idem_replayed_total 2.5\n\
            idem_executed_totals 100\n\
            idem_store_errors_total{op=\"insert\"} NaN\n";
        assert_eq!(parse(text), [7.0, 2.5, 0.0, 0.0, 0.0]);
    }
}
