//! The Grafana dashboard and the Prometheus alert rules under
//! `dev/grafana` name only metrics idem exports, and the dashboard is JSON
//! Grafana can import.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Every `idem_…` word in `text`.
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("idem_") {
        let before = rest[..at].chars().next_back();
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + word.len()..];
        if before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_')) {
            words.insert(word);
        }
    }
    words
}

/// The metric names the crates export: each `"idem_…"` string literal in
/// their sources, but for table names in the queues' SQL.
fn exported() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs: Vec<PathBuf> = ["idem-core/src", "idem-http/src", "idem-inbox/src"]
        .iter()
        .map(|d| root().join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "queue") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for piece in text.split("\"idem_").skip(1) {
                    if let Some((name, _)) = piece.split_once('"') {
                        names.insert(format!("idem_{name}"));
                    }
                }
            }
        }
    }
    names
}

#[test]
fn dashboards_name_only_exported_metrics() {
    let exported = exported();
    for name in [
        "idem_executed_total",
        "idem_mismatch_total",
        "idem_inbox_jobs_total",
    ] {
        assert!(
            exported.contains(name),
            "the scan missed {name}: {exported:?}"
        );
    }
    let dashboard = std::fs::read_to_string(root().join("dev/grafana/idem.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));
    let alerts = std::fs::read_to_string(root().join("dev/grafana/alerts.yml")).unwrap();
    for (file, text) in [("idem.json", &dashboard), ("alerts.yml", &alerts)] {
        let used = metric_words(text);
        assert!(!used.is_empty(), "{file} names no metric");
        for word in &used {
            // Histograms add these series to their name.
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            assert!(
                exported.contains(name) || exported.contains(word.as_str()),
                "{file} names {word}, which idem does not export"
            );
        }
    }
}

#[test]
fn the_scan_finds_a_name_that_is_not_exported() {
    let used = metric_words("sum(rate(idem_made_up_total[5m])) + my_idem_x");
    assert_eq!(used.into_iter().collect::<Vec<_>>(), ["idem_made_up_total"]);
    assert!(!exported().contains("idem_made_up_total"));
}
