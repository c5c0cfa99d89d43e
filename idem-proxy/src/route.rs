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

/// The paths a route covers: idem-http's [`PathPattern`], the grammar
/// route fingerprint policies use too. `/payments` matches that path
/// alone, `*` (or `{id}`) one segment, a last `**` (or `{*rest}`) any rest,
/// none included. The query is never part of the match.
pub use idem_http::{PathPattern, PatternError};

/// Where a protected request's scope (its tenant) comes from. Keys of
/// different scopes never meet: the same key under two scopes is two
/// requests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// No scope of the route's own: the options decide. By default that
    /// is the caller's scope, a hash of its `Authorization` header; with
    /// `shared_across_callers`, one scope for every request.
    Shared,
    /// A fixed name, for a proxy in front of one tenant's service.
    Fixed(String),
    /// The value of a request header. With `hash`, the scope is the first
    /// 32 hex digits of its SHA-256, so a credential such as
    /// `Authorization` never reaches the store or the upstream; a request
    /// without the header is scoped by its caller, as with no scope set.
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

    /// One pattern string means the same thing to the proxy's routes and
    /// to idem-http's route fingerprint policies: each pattern below is
    /// checked against every path through both, and against what it says.
    #[test]
    fn one_pattern_means_the_same_to_routes_and_fingerprint_policies() {
        use idem_core::MemoryStore;
        use idem_http::FingerprintPolicy;

        const PATHS: [&str; 12] = [
            "/",
            "/payments",
            "/payments/",
            "/payments/7",
            "/payments/7/refunds",
            "/paymentsx",
            "/accounts/7/charges",
            "/accounts//charges",
            "/accounts/charges",
            "/a/x/b",
            "/a/x/b/c/d",
            "/a/",
        ];
        // Each pattern and the paths it matches, in the order of PATHS.
        let table = [
            ("/", "x..........."),
            ("/payments", ".x.........."),
            ("/payments/", "..x........."),
            ("/payments/**", ".xxxx......."),
            ("/payments/{*rest}", ".xxxx......."),
            ("/payments/*/refunds", "....x......."),
            ("/payments/{id}/refunds", "....x......."),
            ("/accounts/*/charges", "......x....."),
            ("/accounts/{id}/charges", "......x....."),
            ("/a/*/b/**", ".........xx."),
            ("/a/{x}/b/{*rest}", ".........xx."),
            ("/**", "xxxxxxxxxxxx"),
            ("/{*rest}", "xxxxxxxxxxxx"),
        ];
        let policy = FingerprintPolicy::new().ignore_query();
        for (pattern, expected) in table {
            let route = Route::new(Options::new(MemoryStore::new()))
                .with_paths([PathPattern::parse(pattern).unwrap()]);
            let options = Options::new(MemoryStore::new())
                .try_with_route_fingerprint_policy(pattern, policy.clone())
                .unwrap();
            for (path, want) in PATHS.iter().zip(expected.chars()) {
                let by_route = route.covers(&Method::POST, path);
                let uri: http::Uri = path.parse().unwrap();
                let by_policy = options.fingerprint_policy(&uri).scheme() == policy.scheme();
                assert_eq!(by_route, want == 'x', "route {pattern} on {path}");
                assert_eq!(by_policy, want == 'x', "policy {pattern} on {path}");
            }
        }
        // A last lone `*` is one segment to both, so a policy refuses it:
        // it meant any rest there before.
        let route = Route::new(Options::new(MemoryStore::new()))
            .with_paths([PathPattern::parse("/payments/*").unwrap()]);
        assert!(route.covers(&Method::POST, "/payments/7"));
        assert!(!route.covers(&Method::POST, "/payments/7/refunds"));
        assert!(Options::new(MemoryStore::new())
            .try_with_route_fingerprint_policy("/payments/*", policy.clone())
            .is_err());
        // Patterns neither accepts.
        for pattern in ["payments", "/a/**/b", "/a*", "/a/{id}.json", "/a/{}"] {
            assert!(PathPattern::parse(pattern).is_err(), "{pattern}");
            assert!(
                Options::new(MemoryStore::new())
                    .try_with_route_fingerprint_policy(pattern, policy.clone())
                    .is_err(),
                "{pattern}"
            );
        }
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
