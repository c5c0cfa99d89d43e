//! Records as a store keeps them: tokens, states, and what is written and
//! read back.

use std::fmt;
use std::time::Duration;

use crate::Fingerprint;

/// An owner's fencing token: 128 random bits, new at every claim and
/// takeover. Every owner transition is a compare-and-set on it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token([u8; 16]);

impl Token {
    /// A fresh random token.
    ///
    /// Drawn from the thread's generator, which is reseeded from the OS
    /// first in a process forked since its last draw. A fork copies the
    /// generator's state: without the reseed, parent and child (or two
    /// children) draw the same tokens, and a claim by one looks like the
    /// other's own, so both run the work.
    pub fn random() -> Token {
        thread_local! {
            static DRAWN_IN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let pid = std::process::id();
        let mut rng = rand::rng();
        if DRAWN_IN.with(|drawn| drawn.replace(pid)) != pid {
            // A failed reseed keeps the old state; the OS source failing is
            // not worth failing a claim over in a process that never forked.
            let _ = rng.reseed();
        }
        Token(rand::Rng::random(&mut rng))
    }

    /// Wraps a token read back from a store.
    pub const fn from_bytes(bytes: [u8; 16]) -> Token {
        Token(bytes)
    }

    /// The 16 token bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl TryFrom<&[u8]> for Token {
    type Error = ParseError;

    /// Reads the 16 token bytes a store kept.
    fn try_from(bytes: &[u8]) -> Result<Token, ParseError> {
        <[u8; 16]>::try_from(bytes)
            .map(Token)
            .map_err(|_| ParseError::TokenLength(bytes.len()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Where a record is in its life.
///
/// ```text
///             claim                    complete(token)
///  Absent ───────────▶ InFlight ─────────────────────────▶ Completed(outcome)
///    ▲                 │  │  │ fail(token)                         │
///    │  release(token) │  │  └────────────────────────────▶ Failed(outcome)
///    └─────────────────┘  │ lease lapses, same fingerprint           │
///                         └──▶ taken over: new token          retention lapses ─▶ Absent
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// An owner holds a lease and is running the work.
    InFlight,
    /// The work succeeded; the payload is its encoded outcome.
    Completed,
    /// The work failed in a way the caller chose to remember; the payload is
    /// the encoded error.
    Failed,
}

impl State {
    /// A one-byte code for compact encodings: 0, 1 and 2.
    pub const fn as_u8(self) -> u8 {
        match self {
            State::InFlight => 0,
            State::Completed => 1,
            State::Failed => 2,
        }
    }

    /// The inverse of [`State::as_u8`]; `None` for any other byte.
    pub const fn from_u8(code: u8) -> Option<State> {
        match code {
            0 => Some(State::InFlight),
            1 => Some(State::Completed),
            2 => Some(State::Failed),
            _ => None,
        }
    }
}

impl TryFrom<u8> for State {
    type Error = ParseError;

    /// Reads the code written by [`State::as_u8`].
    fn try_from(code: u8) -> Result<State, ParseError> {
        State::from_u8(code).ok_or(ParseError::StateCode(code))
    }
}

/// Why bytes read back from a store are not a [`Token`], a [`Fingerprint`]
/// or a [`State`]. A store reports it as a corrupt record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// A token is 16 bytes.
    #[error("a token is 16 bytes, not {0}")]
    TokenLength(usize),
    /// A stored fingerprint is 32 bytes (scheme 1) or 33 (a scheme byte and
    /// the digest).
    #[error("a stored fingerprint is 32 or 33 bytes, not {0}")]
    FingerprintLength(usize),
    /// A stored fingerprint names a scheme that cannot exist.
    #[error("fingerprint scheme {0} does not exist")]
    FingerprintScheme(u8),
    /// A scheme-1 fingerprint is stored in 32 bytes, without its scheme
    /// byte; read from 33 it would not be written back as it was.
    #[error("a scheme-1 fingerprint is stored in 32 bytes, not with its scheme byte")]
    FirstSchemeWithByte,
    /// A state code is 0, 1 or 2.
    #[error("state code {0} is not 0 (in flight), 1 (completed) or 2 (failed)")]
    StateCode(u8),
}

/// What a store is asked to write. Durations, not deadlines: the store turns
/// them into deadlines on its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRecord<'a> {
    /// The owner's token.
    pub token: Token,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The state to write.
    pub state: State,
    /// Opaque bytes: the encoded outcome, or for `InFlight` the progress of
    /// durable steps (empty today).
    pub payload: &'a [u8],
    /// How long the lease lasts from now. `Some` exactly when `state` is
    /// [`State::InFlight`].
    pub lease: Option<Duration>,
    /// How long the record is kept from now. Never shorter than `lease`.
    pub retention: Duration,
}

/// A live record read back from a store, with times *remaining* on the
/// store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The token of the owner that wrote it.
    pub token: Token,
    /// The fingerprint of the request that wrote it.
    pub fingerprint: Fingerprint,
    /// Its state.
    pub state: State,
    /// The payload exactly as written.
    pub payload: Vec<u8>,
    /// For `InFlight`: the lease time left, zero once it has lapsed. `None`
    /// for other states.
    pub lease_remaining: Option<Duration>,
    /// The retention time left; always above zero for a record a store
    /// returns, since a record past retention is absent. For a settled
    /// record found by [`Store::insert`](crate::store::Store::insert) a store may
    /// report a lower bound instead (see the store contract's *Time*).
    pub retention_remaining: Duration,
}

impl Record {
    /// Whether this is an `InFlight` record whose lease has lapsed, so that
    /// its key may be taken over.
    pub fn lease_lapsed(&self) -> bool {
        self.state == State::InFlight && self.lease_remaining.is_none_or(|left| left.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_states_read_back_or_say_why_not() {
        let token = Token::random();
        assert_eq!(Token::try_from(&token.as_bytes()[..]), Ok(token));
        assert_eq!(
            Token::try_from(&[1u8; 15][..]),
            Err(ParseError::TokenLength(15))
        );
        for state in [State::InFlight, State::Completed, State::Failed] {
            assert_eq!(State::try_from(state.as_u8()), Ok(state));
        }
        assert_eq!(State::try_from(3), Err(ParseError::StateCode(3)));
    }
}
