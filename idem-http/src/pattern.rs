//! Path patterns: one grammar for every place idem matches a request path
//! (route fingerprint policies here, protected routes in `idem-proxy`).
//!
//! # Why not `matchit`
//!
//! axum's router, `matchit`, spells parameters as this grammar does
//! (`{id}`, `{*rest}`), but it is a router, not a pattern:
//!
//! - It picks the most specific of all its routes. Our lists pick the first
//!   pattern that matches, in the order the user wrote them.
//! - Its catch-all needs at least one byte, so `/payments/{*rest}` misses
//!   `/payments`. Proxy configurations rely on `/payments/**` covering it.
//! - It has no way to match one path against one pattern but a router of
//!   one route each.
//!
//! The parser and matcher below are some sixty lines; a router per
//! pattern would be more code and a second meaning for the same string.

use std::fmt;
use std::str::FromStr;

/// A path pattern: `/`-separated segments matched whole. The query is
/// never part of the match.
///
/// - `/payments` matches that path alone.
/// - `{id}` or `*` matches any one segment, never an empty one:
///   `/accounts/{id}/charges`, `/accounts/*/charges`.
/// - A last `{*rest}` or `**` matches any rest, none included:
///   `/payments/**` matches `/payments`, `/payments/` and
///   `/payments/7/refunds`.
///
/// A pattern starts with `/`. A `*`, `{` or `}` anywhere else is refused,
/// so no pattern means something it does not say.
///
/// ```
/// use idem_http::PathPattern;
///
/// let p: PathPattern = "/accounts/{id}/charges/**".parse().unwrap();
/// assert!(p.matches("/accounts/7/charges"));
/// assert!(p.matches("/accounts/7/charges/9/refunds"));
/// assert!(!p.matches("/accounts//charges"));
/// assert!("/a/**/b".parse::<PathPattern>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Exact(String),
    Any,
}

/// A path pattern that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pattern: String,
    reason: &'static str,
}

impl PatternError {
    pub(crate) fn new(pattern: &str, reason: &'static str) -> PatternError {
        PatternError {
            pattern: pattern.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path pattern `{}`: {}", self.pattern, self.reason)
    }
}

impl std::error::Error for PatternError {}

impl PathPattern {
    /// Every path: `/**`.
    pub fn any() -> PathPattern {
        PathPattern {
            source: "/**".to_owned(),
            segments: Vec::new(),
            rest: true,
        }
    }

    /// Reads a pattern; see [`PathPattern`] for the grammar.
    pub fn parse(pattern: &str) -> Result<PathPattern, PatternError> {
        let error = |reason| Err(PatternError::new(pattern, reason));
        let Some(path) = pattern.strip_prefix('/') else {
            return error("it must start with `/`");
        };
        let mut parts: Vec<&str> = match path {
            "" => Vec::new(),
            _ => path.split('/').collect(),
        };
        let rest = parts.last().is_some_and(|last| is_rest(last));
        if rest {
            parts.pop();
        }
        let mut segments = Vec::with_capacity(parts.len());
        for part in parts {
            segments.push(match part {
                _ if is_rest(part) => return error("`**` or `{*name}` may only end it"),
                "*" => Segment::Any,
                _ if part.starts_with('{') && part.ends_with('}') => {
                    let name = &part[1..part.len() - 1];
                    if name.is_empty() || name.contains(['{', '}', '*']) {
                        return error("a parameter is `{name}`, a name without `{`, `}` or `*`");
                    }
                    Segment::Any
                }
                _ if part.contains('*') => return error("`*` must be a whole segment"),
                _ if part.contains(['{', '}']) => {
                    return error("`{name}` must be a whole segment");
                }
                _ => Segment::Exact(part.to_owned()),
            });
        }
        Ok(PathPattern {
            source: pattern.to_owned(),
            segments,
            rest,
        })
    }

    /// Whether `path` (without its query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        let mut parts: Vec<&str> = match path {
            "" => Vec::new(),
            _ => path.split('/').collect(),
        };
        if self.rest && parts.last() == Some(&"") {
            parts.pop();
        }
        if parts.len() < self.segments.len() || (!self.rest && parts.len() > self.segments.len()) {
            return false;
        }
        self.segments
            .iter()
            .zip(&parts)
            .all(|(segment, part)| match segment {
                Segment::Any => !part.is_empty(),
                Segment::Exact(exact) => exact == part,
            })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// `**` or `{*name}`: any rest.
fn is_rest(part: &str) -> bool {
    part == "**"
        || part
            .strip_prefix("{*")
            .and_then(|p| p.strip_suffix('}'))
            .is_some_and(|name| !name.is_empty() && !name.contains(['{', '}', '*']))
}

impl FromStr for PathPattern {
    type Err = PatternError;

    fn from_str(pattern: &str) -> Result<PathPattern, PatternError> {
        PathPattern::parse(pattern)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_segments() {
        let p = |s| PathPattern::parse(s).unwrap();
        assert!(p("/payments").matches("/payments"));
        assert!(!p("/payments").matches("/payments/1"));
        assert!(!p("/payments").matches("/payment"));
        for one in ["/accounts/*/charges", "/accounts/{id}/charges"] {
            assert!(p(one).matches("/accounts/7/charges"));
            assert!(!p(one).matches("/accounts//charges"));
            assert!(!p(one).matches("/accounts/charges"));
        }
        for rest in ["/payments/**", "/payments/{*rest}"] {
            assert!(p(rest).matches("/payments"));
            assert!(p(rest).matches("/payments/"));
            assert!(p(rest).matches("/payments/7/refunds"));
            assert!(!p(rest).matches("/paymentsx"));
        }
        assert!(p("/**").matches("/"));
        assert!(p("/").matches("/"));
        assert!(!p("/").matches("/a"));
        assert!(PathPattern::any().matches("/anything/at/all"));
        assert_eq!(p("/a/{id}").to_string(), "/a/{id}");
    }

    #[test]
    fn unclear_patterns_are_refused_with_a_reason() {
        for (pattern, reason) in [
            ("payments", "start with `/`"),
            ("/a/**/b", "may only end it"),
            ("/a/{*rest}/b", "may only end it"),
            ("/a*", "whole segment"),
            ("/a/***", "whole segment"),
            ("/a/{id}.json", "whole segment"),
            ("/a/{}", "a name without"),
            ("/a/{b{c}", "a name without"),
            ("/a/{*}", "a name without"),
        ] {
            let error = PathPattern::parse(pattern).unwrap_err().to_string();
            assert!(error.contains(reason), "{pattern}: {error}");
            assert!(error.contains(pattern), "{error}");
        }
    }
}
