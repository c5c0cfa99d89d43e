//! The rows every store shares: idem's `execute`, and the raw protocol
//! through the `Store` trait for in-process stores.

use std::convert::Infallible;
use std::future::ready;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, State, Store};
use idem_core::{Error, Fingerprint, Idempotent};

use crate::fixture::{self, BoxError, Order, LEASE, RETENTION};
use crate::runner::{Outcome, Protocol};

/// idem's `execute` with a trivial work returning a 100-byte outcome, for a
/// 100-byte body.
#[derive(Debug)]
pub(crate) struct IdemRow {
    idem: Idempotent,
    body: Order,
    outcome: String,
}

impl IdemRow {
    pub(crate) fn new(idem: Idempotent) -> IdemRow {
        IdemRow {
            idem: idem.with_retention(RETENTION),
            body: Order::sample(),
            outcome: fixture::outcome(),
        }
    }
}

#[async_trait]
impl Protocol for IdemRow {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let mut ran = false;
        let result: Result<String, Error<Infallible>> = self
            .idem
            .execute(key, &self.body, || {
                ran = true;
                ready(Ok(self.outcome.clone()))
            })
            .await;
        match result {
            Ok(_) if ran => Ok(Outcome::Ran),
            Ok(_) => Ok(Outcome::Replayed),
            Err(Error::InProgress { .. }) => Ok(Outcome::InProgress),
            Err(error) => Err(error.into()),
        }
    }
}

/// idem's `execute_steps` with three trivial steps (each returning a small
/// number) and the same 100-byte outcome as [`IdemRow`]: a first execution
/// costs the claim, one swap per step and the completion; a replay costs
/// the claim alone.
#[derive(Debug)]
pub(crate) struct StepsRow {
    idem: Idempotent,
    body: Order,
    outcome: String,
}

impl StepsRow {
    pub(crate) fn new(idem: Idempotent) -> StepsRow {
        StepsRow {
            idem: idem.with_retention(RETENTION),
            body: Order::sample(),
            outcome: fixture::outcome(),
        }
    }
}

#[async_trait]
impl Protocol for StepsRow {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let mut ran = false;
        let result: Result<String, Error<Infallible>> = self
            .idem
            .execute_steps(key, &self.body, |steps| {
                ran = true;
                async move {
                    for name in ["one", "two", "three"] {
                        let _: u32 = steps.step(name, || ready(Ok(7))).await?;
                    }
                    Ok(self.outcome.clone())
                }
            })
            .await;
        match result {
            Ok(_) if ran => Ok(Outcome::Ran),
            Ok(_) => Ok(Outcome::Replayed),
            Err(Error::InProgress { .. }) => Ok(Outcome::InProgress),
            Err(error) => Err(error.into()),
        }
    }
}

/// The raw protocol on a store's own primitives: `insert`, then `swap` on
/// the token when the claim is ours. For the in-process store, where there
/// is no wire protocol to write by hand.
#[derive(Debug)]
pub(crate) struct StoreRaw<S> {
    store: S,
    fingerprint: Fingerprint,
    payload: Vec<u8>,
}

impl<S: Store> StoreRaw<S> {
    pub(crate) fn new(store: S) -> StoreRaw<S> {
        StoreRaw {
            store,
            fingerprint: fixture::fingerprint(),
            payload: fixture::outcome_payload(),
        }
    }
}

#[async_trait]
impl<S: Store> Protocol for StoreRaw<S> {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        let claim = NewRecord {
            token,
            fingerprint: self.fingerprint,
            state: State::InFlight,
            payload: &[],
            lease: Some(LEASE),
            retention: RETENTION,
        };
        match self.store.insert(key, &claim).await? {
            Insert::Inserted => {
                let done = NewRecord {
                    state: State::Completed,
                    payload: &self.payload,
                    lease: None,
                    ..claim
                };
                if self.store.swap(key, token, &done).await? {
                    Ok(Outcome::Ran)
                } else {
                    Err("raw completion lost its claim".into())
                }
            }
            Insert::Found(found) if found.fingerprint != self.fingerprint => {
                Err("raw claim found another request's record".into())
            }
            Insert::Found(found) if found.state == State::InFlight => Ok(Outcome::InProgress),
            Insert::Found(_) => Ok(Outcome::Replayed),
            _ => Err("the store answered a claim in a way this harness does not know".into()),
        }
    }
}
