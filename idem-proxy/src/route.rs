//! Routes: which requests are protected, with which options and scope.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use idem_http::Options;
use idem_tower::IdempotencyLayer;
use sha2::{Digest, Sha256};
use tower_layer::Layer;

use crate::upstream::Forward;

/// The header the proxy sets on every protected request it forwards,
/// holding the scope the key was checked in. Any value a client sends
/// under this name is removed first, so the upstream can trust it.
pub const SCOPE_HEADER: HeaderName = HeaderName::from_static("idempotency-scope");

/// A path pattern: `/payments` matches that path alone, `*` matches one
/// segment (`/accounts/*/charges`), and a final `**` matches any rest,
/// none included (`/payments/**` matches `/payments` and
/// `/payments/7/refunds`). The query is never part of the match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Exact(String),
    Any,
}

/// A path pattern that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path pattern `{pattern}`: {reason}")]
pub struct PatternError {
    pattern: String,
    reason: &'static str,
}

impl PathPattern {
    /// Every path: `/**`.
    pub fn any() -> PathPattern {
        PathPattern {
            segments: Vec::new(),
            rest: true,
        }
    }

    /// Parses a pattern; it starts with `/`, and `**` may only end it.
    pub fn parse(pattern: &str) -> Result<PathPattern, PatternError> {
        let error = |reason| PatternError {
            pattern: pattern.to_owned(),
            reason,
        };
        let Some(path) = pattern.strip_prefix('/') else {
            return Err(error("it must start with `/`"));
        };
        let mut parts: Vec<&str> = if path.is_empty() {
            Vec::new()
        } else {
            path.split('/').collect()
        };
        let rest = parts.last() == Some(&"**");
        if rest {
            parts.pop();
        }
        let mut segments = Vec::with_capacity(parts.len());
        for part in parts {
            segments.push(match part {
                "*" => Segment::Any,
                "**" => return Err(error("`**` may only be the last segment")),
                _ if part.contains('*') => {
                    return Err(error("`*` must be a whole segment"));
                }
                _ => Segment::Exact(part.to_owned()),
            });
        }
        Ok(PathPattern { segments, rest })
    }

    /// Whether `path` (without its query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        let mut parts = if path.is_empty() {
            Vec::new()
        } else {
            path.split('/').collect::<Vec<_>>()
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
}

/// Where a protected request's scope (its tenant) comes from. Keys of
/// different scopes never meet: the same key under two scopes is two
/// requests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// One scope for every request (`""` unless the options' `Idempotent`
    /// is scoped).
    Shared,
    /// A fixed name, for a proxy in front of one tenant's service.
    Fixed(String),
    /// The value of a request header. With `hash`, the scope is the first
    /// 32 hex digits of its SHA-256, so a credential such as
    /// `Authorization` never reaches the store or the upstream; a request
    /// without the header shares the scope `""`.
    Header {
        /// The header read.
        name: HeaderName,
        /// Whether the value is hashed.
        hash: bool,
    },
}

impl Scope {
    /// The scope of a request with these headers.
    pub(crate) fn of(&self, headers: &HeaderMap) -> Option<String> {
        match self {
            Scope::Shared => None,
            Scope::Fixed(name) => Some(name.clone()),
            Scope::Header { name, hash } => {
                let value = headers.get(name)?;
                Some(if *hash {
                    hex::encode(&Sha256::digest(value.as_bytes())[..16])
                } else {
                    String::from_utf8_lossy(value.as_bytes()).into_owned()
                })
            }
        }
    }
}

/// A protected route: the methods and paths it covers, the protocol's
/// [`Options`] (key header, key required or not, lease and retention
/// through its `Idempotent`, body limits, failure policy, `Prefer: wait`
/// cap) and where the scope comes from.
#[derive(Debug, Clone)]
pub struct Route {
    pub(crate) name: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) paths: Vec<PathPattern>,
    pub(crate) options: Options,
    pub(crate) scope: Scope,
}

impl Route {
    /// Protects `POST` and `PATCH` on every path with `options`, in the
    /// shared scope.
    pub fn new(options: Options) -> Route {
        Route {
            name: "default".to_owned(),
            methods: vec![Method::POST, Method::PATCH],
            paths: vec![PathPattern::any()],
            options,
            scope: Scope::Shared,
        }
    }

    /// The route's name in logs and metrics.
    pub fn with_name(mut self, name: impl Into<String>) -> Route {
        self.name = name.into();
        self
    }

    /// The methods protected, replacing `POST` and `PATCH`.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Route {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The paths covered, replacing every path.
    pub fn with_paths(mut self, paths: impl IntoIterator<Item = PathPattern>) -> Route {
        self.paths = paths.into_iter().collect();
        self
    }

    /// Where the scope comes from.
    pub fn with_scope(mut self, scope: Scope) -> Route {
        self.scope = scope;
        self
    }

    pub(crate) fn covers(&self, method: &Method, path: &str) -> bool {
        self.methods.contains(method) && self.paths.iter().any(|p| p.matches(path))
    }
}

/// A route made ready: its layer wrapped around the upstream.
#[derive(Debug, Clone)]
pub(crate) struct Ready {
    pub(crate) route: Arc<Route>,
    pub(crate) service: idem_tower::IdempotencyService<Forward>,
}

impl Ready {
    pub(crate) fn new(route: Route, forward: Forward) -> Ready {
        let options = route.options.clone().with_methods(route.methods.clone());
        let mut layer = IdempotencyLayer::from_options(options);
        if route.scope != Scope::Shared {
            // The proxy has already put the scope in this header, in place
            // of anything the client sent under that name.
            layer = layer.with_scope(|parts| {
                let value = parts.headers.get(SCOPE_HEADER)?;
                Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
            });
        }
        Ready {
            route: Arc::new(route),
            service: layer.layer(forward),
        }
    }

    /// Sets the scope header for the upstream and the layer.
    pub(crate) fn mark_scope(&self, headers: &mut HeaderMap) {
        if let Some(scope) = self.route.scope.of(headers) {
            match HeaderValue::from_str(&scope) {
                Ok(value) => {
                    headers.insert(SCOPE_HEADER, value);
                }
                Err(_) => {
                    // Not a header value: hash it, so it still separates tenants.
                    let hashed = hex::encode(&Sha256::digest(scope.as_bytes())[..16]);
                    headers.insert(SCOPE_HEADER, HeaderValue::from_str(&hashed).expect("hex"));
                }
            }
        }
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
        assert!(p("/accounts/*/charges").matches("/accounts/7/charges"));
        assert!(!p("/accounts/*/charges").matches("/accounts//charges"));
        assert!(p("/payments/**").matches("/payments"));
        assert!(p("/payments/**").matches("/payments/"));
        assert!(p("/payments/**").matches("/payments/7/refunds"));
        assert!(!p("/payments/**").matches("/paymentsx"));
        assert!(p("/**").matches("/"));
        assert!(PathPattern::any().matches("/anything/at/all"));
        assert!(PathPattern::parse("payments").is_err());
        assert!(PathPattern::parse("/a/**/b").is_err());
        assert!(PathPattern::parse("/a*").is_err());
    }

    #[test]
    fn a_hashed_scope_hides_the_credential() {
        let scope = Scope::Header {
            name: HeaderName::from_static("authorization"),
            hash: true,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(scope.of(&headers), None);
        headers.insert("authorization", HeaderValue::from_static("Bearer secret"));
        let hashed = scope.of(&headers).unwrap();
        assert_eq!(hashed.len(), 32);
        assert!(!hashed.contains("secret"));
    }
}
