//! `--markdown FILE`: each binary rewrites its own tables in a Markdown
//! file (`BENCHMARKS.md`) between a pair of markers, and nothing else.
//!
//! A section named `results` sits between the lines
//! `<!-- BEGIN idem-bench results -->` and `<!-- END idem-bench results -->`.
//! Everything outside them, the marker lines included, is left byte for
//! byte as it was, so the prose around the tables is edited by hand and
//! the figures only by a run.
//!
//! A section whose rows come from several runs (the near cache's, the
//! proxy's, gRPC's) is merged row by row instead ([`merge_rows`]): a run
//! replaces the rows it measured, matched by their first cells, and keeps
//! the others. The scripts under `wrk/` do the same with `wrk/markdown-row`.
//!
//! `idem-grpc-bench` compiles this file as a module of its own, so that its
//! release build needs no HTTP stack: it depends on `std` alone.

use std::fmt;
use std::path::Path;

/// Any error, boxed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a section could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MarkerError {
    /// The file has no begin marker for the section.
    NoBegin(String),
    /// The section's begin marker has no end marker after it.
    NoEnd(String),
    /// A marker of the section appears more than once.
    Repeated(String),
}

impl fmt::Display for MarkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MarkerError::NoBegin(name) => write!(f, "no line {:?}", begin(name)),
            MarkerError::NoEnd(name) => write!(f, "no line {:?} after its begin", end(name)),
            MarkerError::Repeated(name) => write!(f, "the markers of {name:?} appear twice"),
        }
    }
}

impl std::error::Error for MarkerError {}

/// The line that opens section `name`.
pub fn begin(name: &str) -> String {
    format!("<!-- BEGIN idem-bench {name} -->")
}

/// The line that closes section `name`.
pub fn end(name: &str) -> String {
    format!("<!-- END idem-bench {name} -->")
}

/// Where section `name`'s body starts and ends in `document`.
fn bounds(document: &str, name: &str) -> Result<(usize, usize), MarkerError> {
    let (open, close) = (begin(name), end(name));
    let line_at = |marker: &str, from: usize| -> Option<(usize, usize)> {
        let mut at = from;
        for line in document[from..].split_inclusive('\n') {
            if line.trim_end_matches(['\n', '\r']).trim() == marker {
                return Some((at, at + line.len()));
            }
            at += line.len();
        }
        None
    };
    let (_, body_from) = line_at(&open, 0).ok_or_else(|| MarkerError::NoBegin(name.to_owned()))?;
    let (body_to, after) =
        line_at(&close, body_from).ok_or_else(|| MarkerError::NoEnd(name.to_owned()))?;
    if line_at(&open, body_from).is_some() || line_at(&close, after).is_some() {
        return Err(MarkerError::Repeated(name.to_owned()));
    }
    Ok((body_from, body_to))
}

/// `document` with what lies between section `name`'s markers replaced by
/// `body` (a line break is added if `body` lacks one).
pub fn replace(document: &str, name: &str, body: &str) -> Result<String, MarkerError> {
    let (body_from, body_to) = bounds(document, name)?;
    let mut out = String::with_capacity(document.len() + body.len());
    out.push_str(&document[..body_from]);
    out.push_str(body);
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&document[body_to..]);
    Ok(out)
}

/// Rewrites the sections of the file at `path`, each `(name, body)`,
/// leaving the rest of it as it was; nothing is written if one fails.
pub fn rewrite(path: &Path, sections: &[(&str, String)]) -> Result<(), BoxError> {
    let mut document = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for (name, body) in sections {
        document =
            replace(&document, name, body).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::write(path, document).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!(
        "idem-bench: rewrote {} in {}",
        sections
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", "),
        path.display()
    );
    Ok(())
}

/// A rate with thousands separators and no decimals.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The cells of a Markdown table row, trimmed; `None` for a line that is
/// not a row.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// Section `name`'s body with `table` merged into the table already there:
/// each row of `table` replaces the row whose first `key` cells are the
/// same, in its place, or is added at the end; the other rows stay. The
/// header is `table`'s.
pub fn merge_rows(
    document: &str,
    name: &str,
    table: &Table,
    key: usize,
) -> Result<String, MarkerError> {
    let (from, to) = bounds(document, name)?;
    let old = &document[from..to];
    let key_of = |row: &[String]| -> Vec<String> { row.iter().take(key).cloned().collect() };
    let mut new: Vec<Option<&Vec<String>>> = table.rows.iter().map(Some).collect();
    let mut rows = Vec::new();
    // The lines past the header and its separator.
    for line in old.lines().filter_map(cells).skip(2) {
        let cells: Vec<String> = line.iter().map(|c| (*c).to_owned()).collect();
        let fresh = new
            .iter_mut()
            .find(|row| row.is_some_and(|row| key_of(row) == key_of(&cells)))
            .and_then(Option::take);
        rows.push(fresh.cloned().unwrap_or(cells));
    }
    rows.extend(new.into_iter().flatten().cloned());
    let merged = Table {
        header: table.header.clone(),
        right: table.right.clone(),
        rows,
    };
    Ok(merged.render())
}

/// Merges `table` into section `name` of the file at `path`
/// ([`merge_rows`]), leaving the rest of the file as it was.
pub fn rewrite_rows(path: &Path, name: &str, table: &Table, key: usize) -> Result<(), BoxError> {
    let document = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let body =
        merge_rows(&document, name, table, key).map_err(|e| format!("{}: {e}", path.display()))?;
    rewrite(path, &[(name, body)])
}

/// A Markdown table: a header, its alignment and rows of cells.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns; a name starting with `>` is a number
    /// column, aligned right (the `>` is not shown).
    pub fn new(columns: &[&str]) -> Table {
        Table {
            header: columns
                .iter()
                .map(|c| c.trim_start_matches('>').to_owned())
                .collect(),
            right: columns.iter().map(|c| c.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are left empty.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as Markdown lines.
    pub fn render(&self) -> String {
        let line = |cells: &[String]| {
            let mut out = String::from("|");
            for i in 0..self.header.len() {
                out.push(' ');
                out.push_str(cells.get(i).map_or("", |c| c.as_str()));
                out.push_str(" |");
            }
            out.push('\n');
            out
        };
        let mut out = line(&self.header);
        out.push('|');
        for &right in &self.right {
            out.push_str(if right { "---:|" } else { "---|" });
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: &str = "# Title\r\n\nprose *kept*   \n<!-- BEGIN idem-bench results -->\nold\ntable\n<!-- END idem-bench results -->\ntail without newline";

    #[test]
    fn only_the_lines_between_the_markers_change() {
        let out = replace(CARD, "results", "| new |\n").unwrap();
        assert_eq!(
            out,
            "# Title\r\n\nprose *kept*   \n<!-- BEGIN idem-bench results -->\n| new |\n<!-- END idem-bench results -->\ntail without newline"
        );
        // Rewriting again with the same body changes nothing.
        assert_eq!(replace(&out, "results", "| new |").unwrap(), out);
    }

    #[test]
    fn other_sections_are_left_alone() {
        let two = format!("{CARD}\n{}\nkeep\n{}\n", begin("wake"), end("wake"));
        let out = replace(&two, "wake", "x").unwrap();
        assert!(out.starts_with(&CARD[..CARD.find("old").unwrap()]));
        assert!(out.contains("old\ntable\n"));
        assert!(out.ends_with("<!-- BEGIN idem-bench wake -->\nx\n<!-- END idem-bench wake -->\n"));
    }

    #[test]
    fn missing_or_repeated_markers_are_refused() {
        assert_eq!(
            replace("no markers", "results", "x"),
            Err(MarkerError::NoBegin("results".to_owned()))
        );
        let open = format!("{}\nbody\n", begin("results"));
        assert_eq!(
            replace(&open, "results", "x"),
            Err(MarkerError::NoEnd("results".to_owned()))
        );
        let reversed = format!("{}\n{}\n", end("results"), begin("results"));
        assert_eq!(
            replace(&reversed, "results", "x"),
            Err(MarkerError::NoEnd("results".to_owned()))
        );
        let twice = format!("{CARD}\n{CARD}");
        assert_eq!(
            replace(&twice, "results", "x"),
            Err(MarkerError::Repeated("results".to_owned()))
        );
    }

    #[test]
    fn merged_rows_replace_their_own_and_keep_the_others() {
        let card = format!(
            "{}\n| path | c | x |\n|---|---:|---:|\n| a | 1 | old |\n| b | 1 | kept |\n{}\n",
            begin("near"),
            end("near")
        );
        let mut table = Table::new(&["path", ">c", ">x"]);
        table.row(vec!["a".to_owned(), "1".to_owned(), "new".to_owned()]);
        table.row(vec!["c".to_owned(), "1".to_owned(), "added".to_owned()]);
        assert_eq!(
            merge_rows(&card, "near", &table, 2).unwrap(),
            "| path | c | x |\n|---|---:|---:|\n| a | 1 | new |\n| b | 1 | kept |\n| c | 1 | added |\n"
        );
    }

    #[test]
    fn tables_align_number_columns_right() {
        let mut table = Table::new(&["store", ">ops/s"]);
        table.row(vec!["redis".to_owned(), "1,000".to_owned()]);
        assert_eq!(
            table.render(),
            "| store | ops/s |\n|---|---:|\n| redis | 1,000 |\n"
        );
    }
}
