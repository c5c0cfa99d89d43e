//! How records look on the terminal.

use std::fmt::Write;
use std::time::Duration;

use idem_core::inspect::KeyParts;
use idem_core::store::{Record, State, Token};

/// How many bytes of an outcome a preview shows.
pub(crate) const PREVIEW: usize = 120;

/// `1h 02m 03s`, `4.250 s`, `12 ms`.
pub(crate) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!("{}h {:02}m {:02}s", secs / 3600, secs / 60 % 60, secs % 60)
    } else if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else if secs >= 1 {
        format!("{:.3} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The state, with the lease's time left for a record in flight.
pub(crate) fn state(record: &Record) -> String {
    match record.state {
        State::InFlight if record.lease_lapsed() => {
            "in flight, lease LAPSED (the next retry takes the key over)".to_owned()
        }
        State::InFlight => format!(
            "in flight, lease {} left",
            duration(record.lease_remaining.unwrap_or_default())
        ),
        State::Completed => "completed".to_owned(),
        State::Failed => "failed (a remembered failure, replayed to retries)".to_owned(),
    }
}

/// A settled state in a sentence: `completed` or `failed`.
pub(crate) fn settled(state: State) -> &'static str {
    match state {
        State::Completed => "completed",
        State::Failed => "failed",
        State::InFlight => "in-flight",
    }
}

/// The first [`PREVIEW`] bytes of a payload as text, with anything not
/// printable escaped, so no stored byte can drive the terminal.
pub(crate) fn preview(payload: &[u8]) -> String {
    let shown = &payload[..payload.len().min(PREVIEW)];
    let mut out = String::new();
    for chunk in shown.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if payload.len() > PREVIEW {
        out.push('…');
    }
    out
}

/// A stored key as `namespace/scope/client key`, escaped like a preview.
pub(crate) fn key(stored: &str) -> String {
    match KeyParts::parse(stored) {
        Some(parts) => format!(
            "{} (namespace {:?}, scope {:?})",
            preview(parts.client_key.as_bytes()),
            parts.namespace,
            parts.scope
        ),
        None => format!("{} (not an idem key)", preview(stored.as_bytes())),
    }
}

/// Reads a token printed by `inspect` or `list`: 32 hex digits.
pub(crate) fn parse_token(hex: &str) -> Result<Token, String> {
    let bad = || format!("{hex:?} is not a token: give the 32 hex digits `idem inspect` shows");
    if hex.len() != 32 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(Token::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_escape_what_could_drive_a_terminal() {
        assert_eq!(preview(b"{\"a\":1}"), "{\"a\":1}");
        assert_eq!(preview(b"a\x1b[2Jb\xff"), "a\\u{1b}[2Jb\\xff");
        assert!(preview(&[b'x'; 500]).ends_with('…'));
    }

    #[test]
    fn tokens_read_back_as_printed() {
        let token = Token::random();
        assert_eq!(parse_token(&token.to_string()), Ok(token));
        assert!(parse_token("xyz").is_err());
        assert!(parse_token(&"g".repeat(32)).is_err());
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(Duration::from_millis(12)), "12 ms");
        assert_eq!(duration(Duration::from_secs(3723)), "1h 02m 03s");
    }
}
