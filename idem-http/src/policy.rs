//! What the fingerprint covers: form and multipart bodies in canonical
//! form, and per-route policies (JSON Pointers in or out, the query or some
//! of its parameters ignored, a function of the caller's), each a
//! fingerprint scheme of its own.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{GetAll, HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Method, Uri};
use idem_core::fingerprint::{MatchingFingerprints, PartsHasher};
use idem_core::Fingerprint;
use serde_json::Value;

use crate::fingerprint::{content_type, is_json, lazy_fingerprint_of, path_and_query};
use crate::multipart::{self, MultipartError};
use crate::pattern::{PathPattern, PatternError};
use crate::transcode::JsonText;
use crate::{form, lazy_fingerprint, raw_fingerprint};

/// The fingerprint scheme of form (`application/x-www-form-urlencoded`)
/// and `multipart/form-data` bodies in canonical form, with no policy.
/// Records of such bodies written before (scheme [`SCHEME`](crate::SCHEME)
/// and 1, their bytes as they are) keep matching.
pub const BODY_SCHEME: u8 = 3;

/// The schemes of policies: `FIRST_POLICY_SCHEME..=255`, one per policy,
/// from the digest of what the policy says.
const FIRST_POLICY_SCHEME: u8 = 16;

type CustomFn = dyn Fn(&Method, &Uri, &HeaderMap, &[u8]) -> Fingerprint + Send + Sync;

/// What a request's fingerprint covers. The default covers everything:
/// the method, the path and query, the content type and the body in
/// canonical form (JSON with keys sorted, forms and multipart bodies by
/// field name). A policy narrows it, for requests whose retries differ in
/// fields that do not change what they mean (a client timestamp, a trace
/// id, a retry counter). Set one on [`Options`](crate::Options) for every
/// request or per route.
///
/// ```
/// use idem_http::FingerprintPolicy;
///
/// let policy = FingerprintPolicy::new()
///     .exclude(["/client_ts", "/meta/trace_id"])
///     .ignore_query_params(["utm_source"]);
/// # let _ = policy;
/// ```
///
/// # Schemes
///
/// Each policy is a fingerprint scheme of its own, numbered from the digest
/// of what it says (16–255), so a record made under one policy is never
/// compared with another policy's fingerprint. A request under a policy
/// also carries, computed only when a record of their scheme turns up, its
/// fingerprints without a policy and under the policies named with
/// [`replacing`](Self::replacing): setting, changing or removing a policy
/// never turns an honest retry of an earlier request into a 422.
///
/// # Bodies
///
/// For a JSON body a pointer (RFC 6901, `/items/0/price`) names a value in
/// the document; for a form or multipart body, `/name` names every field
/// (or part) of that name. Other bodies are covered whole whatever the
/// pointers say, and so is JSON that does not parse.
#[derive(Clone, Default)]
pub struct FingerprintPolicy {
    body: Body,
    query: Query,
    previous: Vec<FingerprintPolicy>,
}

#[derive(Clone, Default)]
enum Body {
    #[default]
    Whole,
    Include(Vec<String>),
    Exclude(Vec<String>),
    Custom(String, Arc<CustomFn>),
}

#[derive(Clone, Default, Debug)]
enum Query {
    #[default]
    Whole,
    Ignore,
    IgnoreParams(Vec<String>),
}

impl fmt::Debug for FingerprintPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let body = match &self.body {
            Body::Whole => "whole".to_owned(),
            Body::Include(pointers) => format!("include {pointers:?}"),
            Body::Exclude(pointers) => format!("exclude {pointers:?}"),
            Body::Custom(name, _) => format!("custom {name:?}"),
        };
        f.debug_struct("FingerprintPolicy")
            .field("body", &body)
            .field("query", &self.query)
            .field("scheme", &self.scheme())
            .field("previous", &self.previous)
            .finish()
    }
}

impl FingerprintPolicy {
    /// The default: the whole request counts.
    pub fn new() -> FingerprintPolicy {
        FingerprintPolicy::default()
    }

    /// Only the values at these JSON Pointers (or form fields and
    /// multipart parts of these names) count from the body, in the order
    /// given; a pointer to nothing counts as absent, which differs from
    /// `null`. Replaces an earlier body rule.
    ///
    /// # Panics
    ///
    /// If a pointer is neither empty nor starts with `/`: it would match
    /// nothing, silently.
    pub fn include<I>(mut self, pointers: I) -> FingerprintPolicy
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.body = Body::Include(pointers_of(pointers));
        self
    }

    /// Everything in the body counts except the values at these JSON
    /// Pointers (or form fields and parts of these names). An excluded
    /// array element is counted as `null`, so the elements after it keep
    /// their places. Replaces an earlier body rule.
    ///
    /// # Panics
    ///
    /// If a pointer is neither empty nor starts with `/`.
    pub fn exclude<I>(mut self, pointers: I) -> FingerprintPolicy
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.body = Body::Exclude(pointers_of(pointers));
        self
    }

    /// The body and content type count as `f` says: the fingerprint covers
    /// the method, the path and query (as the query rule says), `name` and
    /// the fingerprint `f` returns. Name the function after what it does
    /// and change the name when that changes: the name is part of the
    /// policy's scheme. Replaces an earlier body rule.
    pub fn custom<F>(mut self, name: impl Into<String>, f: F) -> FingerprintPolicy
    where
        F: Fn(&Method, &Uri, &HeaderMap, &[u8]) -> Fingerprint + Send + Sync + 'static,
    {
        self.body = Body::Custom(name.into(), Arc::new(f));
        self
    }

    /// The query string does not count, only the path.
    pub fn ignore_query(mut self) -> FingerprintPolicy {
        self.query = Query::Ignore;
        self
    }

    /// Query parameters of these names (as decoded) do not count; the rest
    /// count in the order sent.
    pub fn ignore_query_params<I>(mut self, names: I) -> FingerprintPolicy
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        self.query = Query::IgnoreParams(names);
        self
    }

    /// Records made under `older` (and the policies it replaced) keep
    /// matching honest retries: name the policy a route had before when
    /// changing it, for as long as the records it made are retained.
    /// Records made without a policy always match.
    ///
    /// # Panics
    ///
    /// If `older` has this policy's scheme number while saying something
    /// else (about one chance in 240): the two could not be told apart;
    /// name a custom function differently or reorder the pointers.
    pub fn replacing(mut self, older: FingerprintPolicy) -> FingerprintPolicy {
        let mut all = older.previous.clone();
        all.insert(
            0,
            FingerprintPolicy {
                previous: Vec::new(),
                ..older
            },
        );
        for older in all {
            let Some(scheme) = older.scheme() else {
                continue;
            };
            let known = std::iter::once(self.scheme())
                .chain(self.previous.iter().map(FingerprintPolicy::scheme))
                .flatten()
                .any(|s| s == scheme);
            if older.id() == self.id() || self.previous.iter().any(|p| p.id() == older.id()) {
                continue;
            }
            assert!(
                !known,
                "fingerprint policies {older:?} and {self:?} share scheme {scheme}"
            );
            self.previous.push(older);
        }
        self
    }

    /// The scheme of this policy's fingerprints: `None` for the default,
    /// which covers the whole request (schemes 1–[`BODY_SCHEME`]).
    pub fn scheme(&self) -> Option<u8> {
        if matches!((&self.body, &self.query), (Body::Whole, Query::Whole)) {
            return None;
        }
        let span = u16::from(u8::MAX - FIRST_POLICY_SCHEME) + 1;
        let offset = u16::from(self.id()[0]) % span;
        Some(FIRST_POLICY_SCHEME + offset as u8)
    }

    /// What the policy says, hashed: its identity.
    fn id(&self) -> [u8; 32] {
        let mut id = PartsHasher::new();
        match &self.body {
            Body::Whole => id.update(b"whole"),
            Body::Include(pointers) | Body::Exclude(pointers) => {
                id.update(match self.body {
                    Body::Include(_) => b"include",
                    _ => b"exclude",
                });
                id.update(&(pointers.len() as u64).to_be_bytes());
                pointers.iter().for_each(|p| id.update(p.as_bytes()));
            }
            Body::Custom(name, _) => {
                id.update(b"custom");
                id.update(name.as_bytes());
            }
        }
        match &self.query {
            Query::Whole => id.update(b"query"),
            Query::Ignore => id.update(b"no query"),
            Query::IgnoreParams(names) => {
                id.update(b"query without");
                id.update(&(names.len() as u64).to_be_bytes());
                names.iter().for_each(|n| id.update(n.as_bytes()));
            }
        }
        *id.finish().as_bytes()
    }

    /// The request's fingerprint under this policy, also matching records
    /// made without a policy and under the policies it replaces (those
    /// computed only when such a record is found). The body is kept (a
    /// shared [`Bytes`]) until then.
    pub fn fingerprint(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> MatchingFingerprints {
        let Some(scheme) = self.scheme() else {
            // JSON and other bodies are alike here: `lazy_fingerprint`.
            let lines = headers.get_all(CONTENT_TYPE);
            let kind = Kind::fields_of(&lines).unwrap_or(Kind::Other);
            let mut matching = default_fingerprint_of(kind, method, uri, headers, lines, body);
            if !self.previous.is_empty() {
                let request = Request::new(method, uri, headers, body);
                matching = request.carry_previous(matching, &self.previous);
            }
            return matching;
        };
        let kind = Kind::of(headers);
        let current = self
            .digest(kind, method, uri, headers, body)
            .with_scheme(scheme);
        let request = Request::new(method, uri, headers, body);
        let mut matching = MatchingFingerprints::new(current);
        matching = request.carry_previous(matching, &self.previous);
        // Records made without a policy, in each scheme they may have.
        if matches!(kind, Kind::Form | Kind::Multipart) {
            let r = Arc::clone(&request);
            matching = matching.or_lazily(BODY_SCHEME, move || {
                default_fingerprint(kind, &r.method, &r.uri, &r.headers, &r.body).current()
            });
        }
        let r = Arc::clone(&request);
        matching = matching.or_lazily(crate::SCHEME, move || {
            lazy_fingerprint(&r.method, &r.uri, &r.headers, &r.body).current()
        });
        matching.or_lazily(Fingerprint::FIRST_SCHEME, move || {
            raw_fingerprint(
                &request.method,
                &request.uri,
                &request.headers,
                &request.body,
            )
        })
    }

    /// This policy's digest of the request (scheme not yet set).
    fn digest(
        &self,
        kind: Kind,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Fingerprint {
        let mut hasher = PartsHasher::new();
        hasher.update(method.as_str().as_bytes());
        match &self.query {
            Query::Whole => hasher.update(path_and_query(uri).as_bytes()),
            Query::Ignore => hasher.update(uri.path().as_bytes()),
            Query::IgnoreParams(names) => hasher.update(without_params(uri, names).as_bytes()),
        }
        hasher.update(&self.id());
        if let Body::Custom(_, f) = &self.body {
            hasher.update(f(method, uri, headers, body).as_bytes());
            return hasher.finish();
        }
        match kind {
            Kind::Multipart => hasher.update(kind.content_type(headers).as_bytes()),
            _ => hasher.update(&content_type(headers)),
        }
        let (tag, digest) = match kind.body_digest(headers, body, &self.body) {
            Some(covered) => covered,
            None => (&b"bytes"[..], Fingerprint::of_bytes(body)),
        };
        hasher.update(tag);
        hasher.update(digest.as_bytes());
        hasher.finish()
    }
}

/// What the request's one `Content-Type` line says its body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Json,
    Form,
    Multipart,
    Other,
}

impl Kind {
    fn of(headers: &HeaderMap) -> Kind {
        match Kind::fields(headers) {
            Some(kind) => kind,
            None if is_json(headers) => Kind::Json,
            None => Kind::Other,
        }
    }

    /// A form or multipart body, told without allocating: the default
    /// fingerprint needs to know no more, and JSON bodies must cost what
    /// they cost before.
    fn fields(headers: &HeaderMap) -> Option<Kind> {
        Kind::fields_of(&headers.get_all(CONTENT_TYPE))
    }

    /// [`fields`](Kind::fields) over the `Content-Type` lines already found.
    fn fields_of(lines: &GetAll<'_, HeaderValue>) -> Option<Kind> {
        let mut lines = lines.iter();
        let (Some(value), None) = (lines.next(), lines.next()) else {
            return None;
        };
        let essence = value.as_bytes().split(|&b| b == b';').next().unwrap_or(b"");
        let essence = essence.trim_ascii();
        if essence.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") {
            Some(Kind::Form)
        } else if essence.eq_ignore_ascii_case(b"multipart/form-data") {
            Some(Kind::Multipart)
        } else {
            None
        }
    }

    /// The content type part: a multipart type without its boundary.
    fn content_type(self, headers: &HeaderMap) -> String {
        let value = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
        match (self, value) {
            (Kind::Multipart, Some(value)) => multipart::without_boundary(value),
            (_, value) => value.unwrap_or_default().to_owned(),
        }
    }

    fn parts<'a>(
        headers: &HeaderMap,
        body: &'a [u8],
    ) -> Result<Vec<multipart::Part<'a>>, MultipartError> {
        let value = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
        multipart::canonical_parts(value.unwrap_or_default(), body)
    }

    /// The body's digest under `rule`, tagged with how it was read; `None`
    /// when the body is covered as its bytes.
    fn body_digest(
        self,
        headers: &HeaderMap,
        body: &[u8],
        rule: &Body,
    ) -> Option<(&'static [u8], Fingerprint)> {
        match self {
            Kind::Json => {
                let digest = match rule {
                    Body::Include(pointers) => {
                        let value: Value = serde_json::from_slice(body).ok()?;
                        let mut hasher = PartsHasher::new();
                        for pointer in pointers {
                            hasher.update(pointer.as_bytes());
                            match value.pointer(pointer) {
                                Some(found) => {
                                    hasher.update(Fingerprint::of_json(found).ok()?.as_bytes())
                                }
                                None => hasher.update(b""),
                            }
                        }
                        hasher.finish()
                    }
                    Body::Exclude(pointers) => {
                        let mut value: Value = serde_json::from_slice(body).ok()?;
                        pointers.iter().for_each(|p| remove(&mut value, p));
                        Fingerprint::of_json(&value).ok()?
                    }
                    _ => Fingerprint::of_json(&JsonText(body)).ok()?,
                };
                Some((b"json", digest))
            }
            Kind::Form => {
                let fields = form::canonical_fields(body);
                let kept = fields.iter().filter(|(name, _)| keeps(rule, name));
                Some((b"form", form::digest(kept)))
            }
            Kind::Multipart => {
                let parts = Kind::parts(headers, body).ok()?;
                let kept = parts.iter().filter(|part| keeps(rule, &part.name));
                Some((b"multipart", multipart::digest(kept)))
            }
            Kind::Other => None,
        }
    }
}

/// Whether a form field or part of this name counts under `rule`.
fn keeps(rule: &Body, name: &[u8]) -> bool {
    let named = |pointers: &[String]| {
        pointers
            .iter()
            .any(|p| field_name(p).is_some_and(|n| n.as_bytes() == name))
    };
    match rule {
        Body::Include(pointers) => named(pointers),
        Body::Exclude(pointers) => !named(pointers),
        _ => true,
    }
}

/// The field a one-token pointer names (`/a~1b` is `a/b`).
fn field_name(pointer: &str) -> Option<String> {
    let token = pointer.strip_prefix('/')?;
    (!token.contains('/')).then(|| token.replace("~1", "/").replace("~0", "~"))
}

/// Removes the value at `pointer`; an array element becomes `null`.
fn remove(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Some(item) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                *item = Value::Null;
            }
        }
        _ => {}
    }
}

/// The path and the query without the parameters named.
fn without_params(uri: &Uri, names: &[String]) -> String {
    let mut out = uri.path().to_owned();
    let Some(query) = uri.query() else {
        return out;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            let decoded = form::canonical_fields(name.as_bytes());
            let decoded = decoded.first().map_or(&[][..], |(n, _)| n.as_slice());
            !names.iter().any(|n| n.as_bytes() == decoded)
        })
        .collect();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out
}

fn pointers_of<I>(pointers: I) -> Vec<String>
where
    I: IntoIterator,
    I::Item: Into<String>,
{
    pointers
        .into_iter()
        .map(|pointer| {
            let pointer = pointer.into();
            assert!(
                pointer.is_empty() || pointer.starts_with('/'),
                "a JSON Pointer is empty or starts with `/`: {pointer:?}"
            );
            pointer
        })
        .collect()
}

/// What a lazily computed fingerprint needs of the request.
struct Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Request {
    fn new(method: &Method, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Arc<Request> {
        Arc::new(Request {
            method: method.clone(),
            uri: uri.clone(),
            headers: headers.clone(),
            body: body.clone(),
        })
    }

    /// Adds the fingerprints under `previous` policies, each computed when
    /// a record of its scheme turns up.
    fn carry_previous(
        self: &Arc<Request>,
        mut matching: MatchingFingerprints,
        previous: &[FingerprintPolicy],
    ) -> MatchingFingerprints {
        for policy in previous {
            let Some(scheme) = policy.scheme() else {
                continue;
            };
            let (r, policy) = (Arc::clone(self), policy.clone());
            matching = matching.or_lazily(scheme, move || {
                let kind = Kind::of(&r.headers);
                policy.digest(kind, &r.method, &r.uri, &r.headers, &r.body)
            });
        }
        matching
    }
}

/// The fingerprint with no policy: form and multipart bodies in canonical
/// form (scheme [`BODY_SCHEME`]) with their earlier byte-exact forms beside
/// them; everything else as [`lazy_fingerprint`].
fn default_fingerprint(
    kind: Kind,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> MatchingFingerprints {
    let lines = headers.get_all(CONTENT_TYPE);
    default_fingerprint_of(kind, method, uri, headers, lines, body)
}

/// [`default_fingerprint`] with the `Content-Type` lines already found.
fn default_fingerprint_of(
    kind: Kind,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    lines: GetAll<'_, HeaderValue>,
    body: &Bytes,
) -> MatchingFingerprints {
    let digest = match kind {
        Kind::Form | Kind::Multipart => kind.body_digest(headers, body, &Body::Whole),
        _ => None,
    };
    let Some((_, digest)) = digest else {
        if kind == Kind::Multipart {
            tracing::debug!("malformed multipart body; fingerprinted as its bytes");
        }
        return lazy_fingerprint_of(method, uri, lines, body);
    };
    let mut hasher = PartsHasher::new();
    hasher.update(method.as_str().as_bytes());
    hasher.update(path_and_query(uri).as_bytes());
    hasher.update(kind.content_type(headers).as_bytes());
    hasher.update(digest.as_bytes());
    let current = hasher.finish().with_scheme(BODY_SCHEME);
    let raw = Request::new(method, uri, headers, body);
    let again = Arc::clone(&raw);
    MatchingFingerprints::new(current)
        .or_lazily(crate::SCHEME, move || {
            raw_fingerprint(&again.method, &again.uri, &again.headers, &again.body)
        })
        .or_lazily(Fingerprint::FIRST_SCHEME, move || {
            raw_fingerprint(&raw.method, &raw.uri, &raw.headers, &raw.body)
        })
}

/// The pattern of a route policy: a [`PathPattern`], as in `idem-proxy`.
pub(crate) type Route = PathPattern;

/// Reads a route policy's pattern. A last lone `*` once meant any rest
/// here and means one segment everywhere now: it is refused, so no route
/// silently covers fewer paths than it did.
fn route_pattern(pattern: &str) -> Result<PathPattern, PatternError> {
    if pattern == "*" || pattern.ends_with("/*") {
        return Err(PatternError::new(
            pattern,
            "a last `*` meant any rest in a route fingerprint policy; \
             write `**` (or `{*rest}`) for any rest, `{name}` for one segment",
        ));
    }
    PathPattern::parse(pattern)
}

impl crate::Options {
    /// The fingerprint policy of every protected request no route policy
    /// names, replacing the default, which covers the whole request. See
    /// [`FingerprintPolicy`].
    pub fn with_fingerprint_policy(mut self, policy: FingerprintPolicy) -> crate::Options {
        self.policy = policy;
        self
    }

    /// The fingerprint policy of requests whose path matches `pattern`, a
    /// [`PathPattern`]: `{id}` (or `*`) for one segment, a last `**` (or
    /// `{*rest}`) for any rest (`/payments/{id}/capture`, `/uploads/**`).
    /// The first pattern set that matches decides.
    ///
    /// # Panics
    ///
    /// If `pattern` is not a [`PathPattern`], or ends in a lone `*`: that
    /// meant any rest here before, and one segment in every pattern now.
    /// Check a pattern read from a file with
    /// [`try_with_route_fingerprint_policy`](Self::try_with_route_fingerprint_policy).
    pub fn with_route_fingerprint_policy(
        self,
        pattern: &str,
        policy: FingerprintPolicy,
    ) -> crate::Options {
        match self.try_with_route_fingerprint_policy(pattern, policy) {
            Ok(options) => options,
            Err(error) => panic!("{error}"),
        }
    }

    /// [`with_route_fingerprint_policy`](Self::with_route_fingerprint_policy),
    /// with an unusable pattern as an error.
    pub fn try_with_route_fingerprint_policy(
        mut self,
        pattern: &str,
        policy: FingerprintPolicy,
    ) -> Result<crate::Options, PatternError> {
        self.routes.push((route_pattern(pattern)?, policy));
        Ok(self)
    }

    /// The policy that covers a request to `uri`.
    pub fn fingerprint_policy(&self, uri: &Uri) -> &FingerprintPolicy {
        self.routes
            .iter()
            .find(|(route, _)| route.matches(uri.path()))
            .map_or(&self.policy, |(_, policy)| policy)
    }

    /// What the exchange checks for this request: its fingerprint under
    /// the policy of its route ([`fingerprint_policy`](Self::fingerprint_policy)),
    /// also matching records made by earlier builds and under earlier
    /// policies. With no policy, a JSON body costs what
    /// [`lazy_fingerprint`] costs.
    pub fn fingerprint(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> MatchingFingerprints {
        self.fingerprint_policy(uri)
            .fingerprint(method, uri, headers, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{canonical_fingerprint, Options};

    fn request(uri: &str, ct: &str, body: &str) -> (Method, Uri, HeaderMap, Bytes) {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, ct.parse().unwrap());
        (
            Method::POST,
            uri.parse().unwrap(),
            headers,
            Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    fn under(policy: &FingerprintPolicy, uri: &str, ct: &str, body: &str) -> MatchingFingerprints {
        let (m, u, h, b) = request(uri, ct, body);
        policy.fingerprint(&m, &u, &h, &b)
    }

    const JSON: &str = "application/json";

    #[test]
    fn no_policy_is_the_fingerprint_json_had() {
        let (m, u, h, b) = request("/p?q=1", JSON, r#"{"b":1, "a":[2]}"#);
        let none = FingerprintPolicy::new();
        assert_eq!(none.scheme(), None);
        assert_eq!(
            none.fingerprint(&m, &u, &h, &b),
            lazy_fingerprint(&m, &u, &h, &b)
        );
        assert_eq!(
            none.fingerprint(&m, &u, &h, &b).current(),
            canonical_fingerprint(&m, &u, &h, &b)
        );
    }

    #[test]
    fn forms_match_in_any_field_order_and_still_match_their_old_records() {
        let ct = "application/x-www-form-urlencoded";
        let none = FingerprintPolicy::new();
        let a = under(&none, "/p", ct, "amount=1250&currency=EUR&tag=a&tag=b");
        let b = under(&none, "/p", ct, "tag=a&currency=%45UR&tag=b&amount=1250");
        assert_eq!(a.current(), b.current());
        assert_eq!(a.current().scheme(), BODY_SCHEME);
        assert_ne!(
            a.current(),
            under(&none, "/p", ct, "tag=b&tag=a&amount=1250&currency=EUR").current()
        );
        // A record written by an earlier build, bytes as they were.
        let (m, u, h, body) = request("/p", ct, "tag=a&currency=%45UR&tag=b&amount=1250");
        let old = raw_fingerprint(&m, &u, &h, &body);
        assert!(b.matches(&old));
        assert!(b.matches(&old.with_scheme(crate::SCHEME)));
        assert!(!a.matches(&old), "the old record was of other bytes");
    }

    #[test]
    fn multipart_bodies_match_under_a_new_boundary() {
        let body = |b: &str| {
            format!("--{b}\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\nxyz\r\n--{b}--\r\n")
        };
        let none = FingerprintPolicy::new();
        let a = under(
            &none,
            "/u",
            "multipart/form-data; boundary=one",
            &body("one"),
        );
        let b = under(
            &none,
            "/u",
            "multipart/form-data; boundary=\"two\"",
            &body("two"),
        );
        assert_eq!(a.current(), b.current());
        assert_eq!(a.current().scheme(), BODY_SCHEME);
        let broken = under(
            &none,
            "/u",
            "multipart/form-data; boundary=one",
            "--one\r\n",
        );
        assert_eq!(
            broken.current().scheme(),
            crate::SCHEME,
            "a malformed body counts as its bytes"
        );
        let p = FingerprintPolicy::new().exclude(["/f"]);
        let c = body("two").replace("xyz", "other");
        assert_eq!(
            under(&p, "/u", "multipart/form-data; boundary=one", &body("one")).current(),
            under(&p, "/u", "multipart/form-data; boundary=two", &c).current()
        );
    }

    #[test]
    fn excluded_pointers_do_not_count_and_included_ones_do() {
        let p = FingerprintPolicy::new().exclude(["/ts", "/meta/trace", "/list/1"]);
        let scheme = p.scheme().unwrap();
        assert!(scheme >= FIRST_POLICY_SCHEME);
        let a = under(
            &p,
            "/p",
            JSON,
            r#"{"amount":5,"ts":1,"meta":{"trace":"x","k":1},"list":[1,2,3]}"#,
        );
        let b = under(
            &p,
            "/p",
            JSON,
            r#"{"list":[1,9,3],"meta":{"k":1,"trace":"y"},"amount":5,"ts":2}"#,
        );
        let c = under(
            &p,
            "/p",
            JSON,
            r#"{"amount":6,"ts":1,"meta":{"trace":"x","k":1},"list":[1,2,3]}"#,
        );
        let d = under(
            &p,
            "/p",
            JSON,
            r#"{"amount":5,"ts":1,"meta":{"trace":"x","k":1},"list":[1,2]}"#,
        );
        assert_eq!(a.current(), b.current());
        assert_eq!(a.current().scheme(), scheme);
        assert_ne!(a.current(), c.current());
        assert_ne!(a.current(), d.current());

        let only = FingerprintPolicy::new().include(["/amount", "/missing"]);
        let x = under(&only, "/p", JSON, r#"{"amount":5,"note":"a"}"#);
        assert_eq!(
            x.current(),
            under(&only, "/p", JSON, r#"{"note":"b","amount":5}"#).current()
        );
        assert_ne!(
            x.current(),
            under(&only, "/p", JSON, r#"{"amount":5,"missing":null}"#).current()
        );
        assert_ne!(x.current().scheme(), a.current().scheme());
    }

    #[test]
    fn a_policy_still_matches_records_made_before_it_and_under_the_one_it_replaces() {
        let body = r#"{"amount":5,"ts":1}"#;
        let (m, u, h, b) = request("/p", JSON, body);
        let before = lazy_fingerprint(&m, &u, &h, &b).current();
        let first = FingerprintPolicy::new().exclude(["/ts"]);
        let under_first = first.fingerprint(&m, &u, &h, &b).current();
        let second = FingerprintPolicy::new()
            .exclude(["/ts", "/note"])
            .replacing(first.clone());
        let now = second.fingerprint(&m, &u, &h, &b);
        assert!(now.matches(&before), "a record made without a policy");
        assert!(
            now.matches(&raw_fingerprint(&m, &u, &h, &b)),
            "a record of scheme 1"
        );
        assert!(
            now.matches(&under_first),
            "a record made under the replaced policy"
        );
        let unrelated = FingerprintPolicy::new().include(["/amount"]);
        assert!(!second
            .fingerprint(&m, &u, &h, &b)
            .matches(&unrelated.fingerprint(&m, &u, &h, &b).current()));
        // Dropping the policy again: named, its records still match.
        let back = FingerprintPolicy::new().replacing(second);
        let plain = back.fingerprint(&m, &u, &h, &b);
        assert_eq!(plain.current(), before);
        assert!(plain.matches(&under_first));
        // A retry that differs in an excluded field matches the policy's record only.
        let (m2, u2, h2, b2) = request("/p", JSON, r#"{"amount":5,"ts":2}"#);
        let retry = first.fingerprint(&m2, &u2, &h2, &b2);
        assert!(retry.matches(&under_first));
        assert!(!retry.matches(&before));
    }

    #[test]
    fn the_query_can_be_ignored_whole_or_by_name() {
        let all = FingerprintPolicy::new().ignore_query();
        let some = FingerprintPolicy::new().ignore_query_params(["attempt", "t s"]);
        let f = |p: &FingerprintPolicy, uri: &str| under(p, uri, JSON, "{}").current();
        assert_eq!(f(&all, "/p?a=1"), f(&all, "/p?b=2"));
        assert_eq!(f(&all, "/p?a=1"), f(&all, "/p"));
        assert_eq!(f(&some, "/p?x=1&attempt=1"), f(&some, "/p?attempt=2&x=1"));
        assert_eq!(f(&some, "/p?t+s=1&x=1"), f(&some, "/p?x=1&t%20s=2"));
        assert_ne!(f(&some, "/p?x=1&attempt=1"), f(&some, "/p?x=2&attempt=1"));
        assert_ne!(f(&all, "/p"), f(&all, "/q"));
    }

    #[test]
    fn a_custom_function_decides_what_the_body_means() {
        let p = FingerprintPolicy::new().custom("first line", |_, _, _, body: &[u8]| {
            Fingerprint::of_bytes(body.split(|&b| b == b'\n').next().unwrap_or_default())
        });
        let f = |body: &str| under(&p, "/p", "text/plain", body).current();
        assert_eq!(f("a\nb"), f("a\nc"));
        assert_ne!(f("a\nb"), f("b\nb"));
        let renamed = FingerprintPolicy::new()
            .custom("other", |_, _, _, _: &[u8]| Fingerprint::of_bytes(b""));
        assert_ne!(p.scheme(), None);
        assert_ne!(p.id(), renamed.id());
    }

    #[test]
    fn routes_pick_their_policy() {
        let options = Options::new(idem_core::MemoryStore::new())
            .with_route_fingerprint_policy(
                "/payments/{id}/capture",
                FingerprintPolicy::new().ignore_query(),
            )
            .with_route_fingerprint_policy("/uploads/**", FingerprintPolicy::new().exclude(["/x"]));
        let scheme = |path: &str| options.fingerprint_policy(&path.parse().unwrap()).scheme();
        assert_eq!(
            scheme("/payments/7/capture"),
            FingerprintPolicy::new().ignore_query().scheme()
        );
        assert_eq!(
            scheme("/payments/7/capture?x=1"),
            FingerprintPolicy::new().ignore_query().scheme()
        );
        assert_eq!(scheme("/payments/7"), None);
        assert_eq!(scheme("/payments/7/capture/more"), None);
        assert_eq!(
            scheme("/uploads/a/b"),
            FingerprintPolicy::new().exclude(["/x"]).scheme()
        );
        assert_eq!(scheme("/other"), None);
    }

    #[test]
    fn a_last_lone_star_is_refused_not_read_anew() {
        // Pins the grammar change: `/uploads/*` covered `/uploads/a/b` here.
        for pattern in ["/uploads/*", "*", "/a/{id}/*"] {
            let options = Options::new(idem_core::MemoryStore::new());
            let error = options
                .try_with_route_fingerprint_policy(pattern, FingerprintPolicy::new())
                .unwrap_err()
                .to_string();
            assert!(error.contains("write `**`"), "{error}");
        }
        let options = Options::new(idem_core::MemoryStore::new());
        assert!(options
            .try_with_route_fingerprint_policy("uploads/{id}", FingerprintPolicy::new())
            .is_err());
    }

    #[test]
    #[should_panic(expected = "starts with `/`")]
    fn a_pointer_without_a_slash_is_refused() {
        let _ = FingerprintPolicy::new().exclude(["ts"]);
    }
}
