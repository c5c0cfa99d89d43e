//! Where a command reads its store's URL: a flag, a file or the
//! environment. A URL with a password belongs in a file or the environment,
//! where other users of the machine cannot read it from the process list.

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable every command reads a store URL from.
pub const STORE_ENV: &str = "IDEM_STORE";

/// The store URL a command was given, the first found of: `flag`
/// (`--store URL`), the first line of `file` (`--store-file PATH`), or the
/// environment variable [`STORE_ENV`]. `None` when none is set.
///
/// Surrounding whitespace is trimmed. The URL is returned as given; parse
/// it into a [`StoreUrl`](crate::StoreUrl) to show it without its password.
pub fn given_url(flag: Option<&str>, file: Option<&Path>) -> Result<Option<String>, GivenUrlError> {
    if let Some(flag) = flag {
        return Ok(Some(flag.trim().to_owned()));
    }
    if let Some(file) = file {
        let text = std::fs::read_to_string(file).map_err(|error| GivenUrlError {
            file: file.to_owned(),
            problem: error.to_string(),
        })?;
        let line = text.lines().map(str::trim).find(|line| !line.is_empty());
        return match line {
            Some(line) => Ok(Some(line.to_owned())),
            None => Err(GivenUrlError {
                file: file.to_owned(),
                problem: "the file is empty".to_owned(),
            }),
        };
    }
    Ok(std::env::var(STORE_ENV)
        .ok()
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty()))
}

/// A store URL file that could not be read, or holds no URL. It names the
/// file, never its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenUrlError {
    file: PathBuf,
    problem: String,
}

impl fmt::Display for GivenUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read the store URL from {}: {}",
            self.file.display(),
            self.problem
        )
    }
}

impl std::error::Error for GivenUrlError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_comes_first_then_the_file() {
        let dir = std::env::temp_dir().join(format!("idem-given-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("store");
        std::fs::write(&file, "\n  postgres://app:hunter2@db/app  \n# more\n").unwrap();
        assert_eq!(
            given_url(Some("redis://h"), Some(&file))
                .unwrap()
                .as_deref(),
            Some("redis://h")
        );
        assert_eq!(
            given_url(None, Some(&file)).unwrap().as_deref(),
            Some("postgres://app:hunter2@db/app")
        );
        std::fs::write(&file, " \n").unwrap();
        let empty = given_url(None, Some(&file)).unwrap_err().to_string();
        assert!(empty.contains("empty"), "{empty}");
        let missing = given_url(None, Some(&dir.join("nope"))).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
