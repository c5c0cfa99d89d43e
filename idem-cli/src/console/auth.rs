//! Who may use the console: the token on every request, the host a
//! loopback console answers, and the CSRF token of every form that writes.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Form, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use subtle::ConstantTimeEq;

use super::{pages, param, Console, Params};

/// The cookie `/login` sets, holding the token.
const COOKIE: &str = "idem_console";

/// A token must be this long at least, so it cannot be guessed.
const MIN_TOKEN: usize = 16;

/// Refuses a token too short to be secret or that a cookie cannot carry.
pub(super) fn check_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN {
        return Err(format!(
            "the console token is {} characters; give at least {MIN_TOKEN}",
            token.len()
        ));
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b";,\"\\".contains(&b))
    {
        return Err(
            "the console token holds a character a cookie cannot carry: use printable \
             ASCII without ; , \" or \\"
                .to_owned(),
        );
    }
    Ok(())
}

/// 32 random bytes in hex.
pub(super) fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Compares in time that does not depend on where the strings differ.
fn same(given: &str, expected: &str) -> bool {
    bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

/// Whether the request carries `token`, as a bearer header or the cookie.
fn carries(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .any(|given| same(given.trim(), token));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, given)| name == COOKIE && same(given, token));
    bearer || cookie
}

/// Whether the `Host` header names a loopback host. A console without a
/// token answers only these, so that a web page whose name was rebound to
/// 127.0.0.1 cannot read it.
fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Checks every request, then marks every response as not to be cached,
/// framed or sent on as a referrer.
pub(super) async fn guard(
    State(console): State<Arc<Console>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = match &console.token {
        Some(token) => request.uri().path() == "/login" || carries(request.headers(), token),
        None => host_is_loopback(request.headers()),
    };
    let mut response = if allowed {
        next.run(request).await
    } else if console.token.is_some() {
        pages::message(
            StatusCode::UNAUTHORIZED,
            "Token required",
            html! { p { "This console needs its token. " a href="/login" { "Log in" } "." } },
        )
    } else {
        pages::message(
            StatusCode::FORBIDDEN,
            "Loopback only",
            html! { p { "This console has no token and answers only requests for localhost or 127.0.0.1." } },
        )
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The refusal of a form that does not carry this process's CSRF token;
/// `None` when it carries it.
pub(super) fn check_csrf(console: &Console, form: &Params) -> Option<Response> {
    if same(param(form, "csrf"), &console.csrf) {
        None
    } else {
        Some(pages::message(
            StatusCode::FORBIDDEN,
            "Refused",
            html! { p { "The form did not carry this console's CSRF token; nothing changed. Reload the page and try again." } },
        ))
    }
}

/// The page that asks for the token.
pub(super) async fn login_form() -> Response {
    pages::message(
        StatusCode::OK,
        "Log in",
        html! {
            form method="post" action="/login" {
                label { "Token " input type="password" name="token" required; }
                " " button { "Log in" }
            }
        },
    )
}

/// Sets the cookie when the token given is the console's.
pub(super) async fn login(
    State(console): State<Arc<Console>>,
    Form(form): Form<Params>,
) -> Response {
    match &console.token {
        Some(token) if same(param(&form, "token"), token) => {
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
            let mut response = Redirect::to("/keys").into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Some(_) => pages::message(
            StatusCode::UNAUTHORIZED,
            "Wrong token",
            html! { p { a href="/login" { "Try again" } "." } },
        ),
        None => Redirect::to("/keys").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_tokens() {
        let mut headers = HeaderMap::new();
        for (host, loopback) in [
            ("127.0.0.1:7070", true),
            ("localhost:7070", true),
            ("[::1]:7070", true),
            ("evil.example:7070", false),
            ("10.0.0.1", false),
        ] {
            headers.insert(header::HOST, HeaderValue::from_static(host));
            assert_eq!(host_is_loopback(&headers), loopback, "{host}");
        }
        assert!(check_token("short").is_err());
        assert!(check_token("a-long-enough-token;").is_err());
        assert!(check_token("a-long-enough-token").is_ok());
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; idem_console=tok"),
        );
        assert!(carries(&headers, "tok"));
        assert!(!carries(&headers, "to"));
    }
}
