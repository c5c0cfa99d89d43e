//! `Prefer: wait=N` (RFC 7240): how long a client asks to wait for a
//! request whose key is in progress, instead of a 409.

use std::time::Duration;

use http::header::HeaderName;
use http::HeaderMap;

/// The request header carrying preferences.
pub const PREFER: HeaderName = HeaderName::from_static("prefer");

/// The response header naming the preferences the server applied; a
/// request that waited for its key's outcome gets `Preference-Applied:
/// wait`.
pub const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// The `wait` preference of a request, in seconds: the first `wait=N`
/// among its `Prefer` headers, where `N` is a whole number of seconds
/// (bare or quoted). A preference that does not parse is ignored, as RFC
/// 7240 asks; so are the other preferences and any parameters.
pub fn preferred_wait(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|preference| {
            // `token [= word] *(; parameter)`: the parameters are not ours.
            let preference = preference.split(';').next()?.trim();
            let (name, value) = preference.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Digits too many for a u64 are a very long wait.
            Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)))
        })
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn wait_of(values: &[&str]) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(PREFER, HeaderValue::from_str(value).unwrap());
        }
        preferred_wait(&headers)
    }

    #[test]
    fn wait_is_read_among_other_preferences_and_headers() {
        let secs = |n| Some(Duration::from_secs(n));
        assert_eq!(wait_of(&["wait=5"]), secs(5));
        assert_eq!(wait_of(&["respond-async, WAIT = 7"]), secs(7));
        assert_eq!(wait_of(&["return=minimal", "wait=\"3\"; x=1"]), secs(3));
        assert_eq!(wait_of(&["wait=0"]), secs(0));
        assert_eq!(wait_of(&["wait=2", "wait=9"]), secs(2));
        assert_eq!(
            wait_of(&["wait=99999999999999999999999"]),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn anything_else_is_no_preference() {
        for values in [
            &[][..],
            &["respond-async"],
            &["wait"],
            &["wait="],
            &["wait=-1"],
            &["wait=1.5"],
            &["wait=soon"],
            &["waiting=3"],
        ] {
            assert_eq!(wait_of(values), None, "{values:?}");
        }
    }
}
