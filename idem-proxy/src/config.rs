//! The configuration file (`--config idem-proxy.toml`): where to listen,
//! the upstream, the store, and the protected routes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::store::{NearCache, Store};
use idem_core::Idempotent;
use idem_http::Options;
use serde::Deserialize;

use crate::route::{PathPattern, Route, Scope};

/// The proxy's settings, as the file holds them; the command line's
/// `--listen`, `--upstream`, `--store`, `--admin` and `--lease` take
/// precedence over the file's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The address clients connect to.
    pub listen: Option<SocketAddr>,
    /// The upstream's URL (`http://host:port`, optionally with a path
    /// prefix).
    pub upstream: Option<String>,
    /// A PEM file of the CA certificates an `https://` upstream is checked
    /// against, instead of Mozilla's roots.
    pub upstream_ca: Option<PathBuf>,
    /// `true`: an `https://` upstream's certificate is not checked at all.
    /// For tests; never the default.
    pub upstream_insecure: Option<bool>,
    /// The listener's certificate chain (PEM): with `tls_key`, clients
    /// connect over TLS. Both files are read again on `SIGHUP`.
    pub tls_cert: Option<PathBuf>,
    /// The listener's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The store's URL (`idem-stores`); `sqlite://idem-proxy.db` when unset.
    pub store: Option<String>,
    /// The admin address serving `/healthz` and `/metrics`; none when unset.
    pub admin: Option<SocketAddr>,
    /// How long the upstream may take to answer (`"30s"`).
    pub upstream_timeout: Option<String>,
    /// How long a graceful shutdown waits for requests in flight (`"30s"`).
    pub shutdown_grace: Option<String>,
    /// The lease of every route that sets none (`"60s"`).
    pub lease: Option<String>,
    /// The retention of every route that sets none (`"24h"`).
    pub retention: Option<String>,
    /// Whether replays are answered from a near cache in this process
    /// (`NearCache`, shared by every route): no store round trip for a
    /// key this process has seen settled. Off by default; each proxy
    /// process has its own, and correctness does not depend on it.
    pub near_cache: Option<bool>,
    /// The protected routes, first match wins; none means the default
    /// route (`POST` and `PATCH` with a key, every path).
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
}

/// One `[[route]]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteConfig {
    /// Its name in logs and metrics.
    pub name: Option<String>,
    /// The methods protected (default `["POST", "PATCH"]`).
    pub methods: Option<Vec<String>>,
    /// The path patterns covered (default `["/**"]`).
    pub paths: Option<Vec<String>>,
    /// `"required"` (400 without a key) or `"optional"` (the default:
    /// forwarded unprotected without one).
    pub key: Option<String>,
    /// The key header (default `Idempotency-Key`).
    pub header: Option<String>,
    /// The lease (`"60s"`): how long a claimed key stays blocked when the
    /// proxy that claimed it dies.
    pub lease: Option<String>,
    /// How long outcomes are kept (`"24h"`).
    pub retention: Option<String>,
    /// The namespace keys are stored under (default: the core's).
    pub namespace: Option<String>,
    /// The scope: `{ header = "authorization" }` (hashed unless
    /// `hash = false`) or `{ name = "shop-1" }`. Without one, a key is
    /// scoped by its caller's `Authorization` header, hashed;
    /// `{ shared_across_callers = true }` shares keys across callers.
    pub scope: Option<ScopeConfig>,
    /// The largest request body, in bytes (default 1 MiB); larger is 413.
    pub max_request_body: Option<usize>,
    /// The largest response body recorded, in bytes (default 1 MiB).
    pub max_response_body: Option<usize>,
    /// Whether 5xx answers are recorded (default `false`: they release the
    /// key, so a retry is forwarded again; 2xx–4xx are always recorded).
    pub record_server_errors: Option<bool>,
    /// Whether a store failure forwards the request unprotected (default
    /// `false`: 503).
    pub fail_open: Option<bool>,
    /// The cap on `Prefer: wait=N` (`"10s"`; `"0s"` turns waiting off).
    pub max_wait: Option<String>,
    /// The bound on one store call (`"5s"`).
    pub store_timeout: Option<String>,
}

/// The `scope` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ScopeConfig {
    /// The header whose value is the scope.
    pub header: Option<String>,
    /// Whether that value is hashed (default `true`).
    pub hash: Option<bool>,
    /// A fixed scope.
    pub name: Option<String>,
    /// `true`: every caller shares a key, and a request with a key and
    /// body another caller used gets that caller's response. Only where
    /// all callers are one party.
    pub shared_across_callers: Option<bool>,
    /// `false`: requests scoped by their caller no longer look for a
    /// record made before callers were told apart (default `true`; see
    /// `idem_http::Options::check_unscoped_records`).
    pub check_unscoped_records: Option<bool>,
}

/// A configuration that cannot be used; the message names the setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML of this shape.
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// A setting's value is not usable.
    #[error("{setting}: {reason}")]
    Invalid {
        /// Where: `route[1].lease`, `upstream`, ….
        setting: String,
        /// Why.
        reason: String,
    },
}

fn invalid(setting: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Parses a configuration file's text.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text)
    }

    /// The upstream time-out, if set.
    pub fn upstream_timeout(&self) -> Result<Option<Duration>, ConfigError> {
        self.upstream_timeout
            .as_deref()
            .map(|text| parse_duration(text).map_err(|r| invalid("upstream_timeout", r)))
            .transpose()
    }

    /// The shutdown grace, if set.
    pub fn shutdown_grace(&self) -> Result<Option<Duration>, ConfigError> {
        self.shutdown_grace
            .as_deref()
            .map(|text| parse_duration(text).map_err(|r| invalid("shutdown_grace", r)))
            .transpose()
    }

    /// The routes over `store`, checked: the default route when the file
    /// names none.
    pub fn routes(&self, store: Arc<dyn Store>) -> Result<Vec<Route>, ConfigError> {
        let store: Arc<dyn Store> = match self.near_cache {
            Some(true) => Arc::new(NearCache::new(store)),
            _ => store,
        };
        let defaults = RouteConfig {
            lease: self.lease.clone(),
            retention: self.retention.clone(),
            ..RouteConfig::default()
        };
        if self.routes.is_empty() {
            return Ok(vec![route(&defaults, &defaults, "route", &store)?]);
        }
        self.routes
            .iter()
            .enumerate()
            .map(|(i, config)| route(config, &defaults, &format!("route[{i}]"), &store))
            .collect()
    }
}

fn route(
    config: &RouteConfig,
    defaults: &RouteConfig,
    at: &str,
    store: &Arc<dyn Store>,
) -> Result<Route, ConfigError> {
    let setting = |name: &str| format!("{at}.{name}");
    let duration = |name: &str, value: &Option<String>| {
        value
            .as_deref()
            .map(|text| parse_duration(text).map_err(|r| invalid(setting(name), r)))
            .transpose()
    };
    let mut idem = Idempotent::from_arc(Arc::clone(store));
    let lease = config.lease.clone().or_else(|| defaults.lease.clone());
    if let Some(lease) = duration("lease", &lease)? {
        idem = idem.with_lease(lease);
    }
    let retention = config
        .retention
        .clone()
        .or_else(|| defaults.retention.clone());
    if let Some(retention) = duration("retention", &retention)? {
        idem = idem.with_retention(retention);
    }
    if let Some(namespace) = &config.namespace {
        idem = idem.with_namespace(namespace.clone());
    }
    let mut options = Options::from_idempotent(idem);
    if let Some(header) = &config.header {
        let name = HeaderName::try_from(header.as_str())
            .map_err(|_| invalid(setting("header"), "not a header name"))?;
        options = options.with_header_name(name);
    }
    match config.key.as_deref() {
        None | Some("optional") => {}
        Some("required") => options = options.require_key(true),
        Some(other) => {
            return Err(invalid(
                setting("key"),
                format!("`{other}`: expected \"required\" or \"optional\""),
            ))
        }
    }
    if let Some(bytes) = config.max_request_body {
        options = options.with_max_request_body(bytes);
    }
    if let Some(bytes) = config.max_response_body {
        options = options.with_max_response_body(bytes);
    }
    if let Some(record) = config.record_server_errors {
        options = options.record_server_errors(record);
    }
    if let Some(open) = config.fail_open {
        options = options.fail_open(open);
    }
    if let Some(wait) = duration("max_wait", &config.max_wait)? {
        options = options.with_max_wait(wait);
    }
    if let Some(timeout) = duration("store_timeout", &config.store_timeout)? {
        options = options.with_store_timeout(timeout);
    }
    let mut route = Route::new(options);
    if let Some(name) = &config.name {
        route = route.with_name(name.clone());
    }
    if let Some(methods) = &config.methods {
        let methods = methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| invalid(setting("methods"), format!("`{m}` is not a method")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        route = route.with_methods(methods);
    }
    if let Some(paths) = &config.paths {
        let paths = paths
            .iter()
            .map(|p| PathPattern::parse(p).map_err(|e| invalid(setting("paths"), e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        route = route.with_paths(paths);
    }
    if let Some(scope) = &config.scope {
        let default = scope.header.is_none() && scope.name.is_none() && scope.hash.is_none();
        let caller = match (scope.shared_across_callers, scope.check_unscoped_records) {
            (Some(true), None) => Some(route.options.clone().shared_across_callers()),
            (None | Some(false), Some(check)) => {
                Some(route.options.clone().check_unscoped_records(check))
            }
            (None | Some(false), None) => None,
            (Some(true), Some(_)) => {
                return Err(invalid(
                    setting("scope"),
                    "`check_unscoped_records` is for keys scoped by caller, not shared",
                ))
            }
        };
        match caller {
            Some(_) if !default => {
                return Err(invalid(
                    setting("scope"),
                    "`shared_across_callers` and `check_unscoped_records` are for routes without `header` or `name`",
                ))
            }
            Some(options) => {
                route.options = options;
                return Ok(route);
            }
            // `{ shared_across_callers = false }`: the default, said aloud.
            None if default => return Ok(route),
            None => {}
        }
        route = route.with_scope(match (&scope.header, &scope.name) {
            (Some(header), None) => Scope::Header {
                name: HeaderName::try_from(header.as_str())
                    .map_err(|_| invalid(setting("scope.header"), "not a header name"))?,
                hash: scope.hash.unwrap_or(true),
            },
            (None, Some(name)) if scope.hash.is_none() => Scope::Fixed(name.clone()),
            _ => {
                return Err(invalid(
                    setting("scope"),
                    "set either `header` (and optionally `hash`) or `name`",
                ))
            }
        });
    }
    Ok(route)
}

/// Parses `250ms`, `60s`, `5m`, `24h` or `7d`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit (ms, s, m, h or d)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("`{other}` is not a unit (ms, s, m, h or d)")),
    };
    number
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::MemoryStore;

    fn store() -> Arc<dyn Store> {
        Arc::new(MemoryStore::new())
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("60").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5 weeks").is_err());
    }

    #[test]
    fn a_file_without_routes_protects_post_and_patch_everywhere() {
        let config =
            Config::from_toml("upstream = \"http://127.0.0.1:3000\"\nlease = \"5s\"").unwrap();
        let routes = config.routes(store()).unwrap();
        assert_eq!(routes.len(), 1);
        assert!(routes[0].covers(&Method::POST, "/anything"));
        assert!(routes[0].covers(&Method::PATCH, "/"));
        assert!(!routes[0].covers(&Method::PUT, "/anything"));
        assert_eq!(
            routes[0].options.idempotent().lease(),
            Duration::from_secs(5)
        );
    }

    /// With `near_cache`, a record the proxy has seen settled is answered
    /// from the process: deleted from the store behind the proxy's back,
    /// it still replays; without it, the key is free again.
    #[tokio::test]
    async fn near_cache_answers_replays_from_the_process() {
        use idem_core::store::Reset;
        use idem_core::{Begin, Fingerprint};

        for (near, replays) in [("near_cache = true", true), ("", false)] {
            let memory = store();
            let config = Config::from_toml(near).unwrap();
            let routes = config.routes(Arc::clone(&memory)).unwrap();
            let idem = routes[0].options.idempotent();
            let fingerprint = Fingerprint::of_bytes(b"body");
            let Ok(Begin::Run(lease)) = idem.begin("k", fingerprint).await else {
                panic!("the first request does not run");
            };
            lease.complete(b"answer").await.unwrap();
            // The first replay reads the store, and so fills the cache.
            let replay = idem.begin("k", fingerprint).await;
            assert!(matches!(replay, Ok(Begin::Replay(_))), "{replay:?}");
            let reset = Idempotent::from_arc(Arc::clone(&memory)).reset("k").await;
            assert!(matches!(reset, Ok(Reset::Deleted(_))), "{reset:?}");
            let after = idem.begin("k", fingerprint).await;
            assert_eq!(
                matches!(after, Ok(Begin::Replay(_))),
                replays,
                "{near:?}: {after:?}"
            );
        }
    }

    #[test]
    fn routes_read_every_setting() {
        let config = Config::from_toml(
            r#"
            [[route]]
            name = "payments"
            methods = ["post", "PUT"]
            paths = ["/payments/**"]
            key = "required"
            header = "X-Request-Key"
            lease = "30s"
            retention = "3d"
            scope = { header = "authorization" }
            max_request_body = 2048
            record_server_errors = true
            max_wait = "2s"
            "#,
        )
        .unwrap();
        let routes = config.routes(store()).unwrap();
        let route = &routes[0];
        assert_eq!(route.name, "payments");
        assert!(route.covers(&Method::PUT, "/payments/7"));
        assert!(!route.covers(&Method::PATCH, "/payments/7"));
        assert!(!route.covers(&Method::POST, "/orders"));
        assert_eq!(route.options.header_name(), "x-request-key");
        assert_eq!(route.options.max_request_body(), 2048);
        assert_eq!(route.options.idempotent().lease(), Duration::from_secs(30));
        assert!(matches!(route.scope, Scope::Header { hash: true, .. }));
    }

    #[test]
    fn keys_are_scoped_by_caller_unless_shared_by_name() {
        let scoped = |text: &str| {
            let routes = Config::from_toml(text).unwrap().routes(store()).unwrap();
            let options = &routes[0].options;
            assert_eq!(routes[0].scope, Scope::Shared, "{text}");
            !options.is_shared_across_callers()
        };
        assert!(scoped("[[route]]"));
        assert!(scoped(
            "[[route]]\nscope = { shared_across_callers = false }"
        ));
        assert!(scoped(
            "[[route]]\nscope = { check_unscoped_records = false }"
        ));
        assert!(!scoped(
            "[[route]]\nscope = { shared_across_callers = true }"
        ));
        // No file: the one route the command makes from its flags.
        assert!(!Config::default().routes(store()).unwrap()[0]
            .options
            .is_shared_across_callers());
    }

    #[test]
    fn bad_settings_name_themselves() {
        for (text, setting) in [
            ("[[route]]\nkey = \"maybe\"", "route[0].key"),
            ("[[route]]\nlease = \"soon\"", "route[0].lease"),
            ("[[route]]\npaths = [\"payments\"]", "route[0].paths"),
            (
                "[[route]]\nscope = { name = \"a\", header = \"b\" }",
                "route[0].scope",
            ),
            (
                "[[route]]\nscope = { name = \"a\", shared_across_callers = true }",
                "route[0].scope",
            ),
            (
                "[[route]]\nscope = { shared_across_callers = true, check_unscoped_records = true }",
                "route[0].scope",
            ),
        ] {
            let error = Config::from_toml(text)
                .unwrap()
                .routes(store())
                .unwrap_err();
            assert!(error.to_string().starts_with(setting), "{error}");
        }
        assert!(Config::from_toml("[[route]]\nleese = \"5s\"").is_err());
    }
}
