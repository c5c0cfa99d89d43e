//! The simulated payment gateway and the ledger of charges it made.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::{Deserialize, Serialize};

/// One charge the gateway made: what `POST /payments` returns and
/// `GET /payments` lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The charge's id, `ch_` and 16 hex digits.
    pub id: String,
    /// The amount in the currency's minor unit (cents), always positive.
    pub amount: i64,
    /// The ISO 4217 currency code, such as `EUR`.
    pub currency: String,
    /// The `Idempotency-Key` the charge was made under, so that a ledger
    /// can be checked for keys charged twice.
    pub idempotency_key: String,
    /// When the charge was made, RFC 3339 in UTC.
    pub created_at: String,
}

impl Charge {
    /// A new charge made now under `key`, with a fresh id.
    pub(crate) fn new(key: &str, amount: i64, currency: &str) -> Charge {
        Charge {
            id: format!("ch_{:016x}", rand::rng().random::<u64>()),
            amount,
            currency: currency.to_owned(),
            idempotency_key: key.to_owned(),
            created_at: rfc3339(SystemTime::now()),
        }
    }
}

/// A stand-in for a remote payment gateway: every charge takes a network
/// round trip's worth of time before it lands in the [`Ledger`].
#[derive(Debug)]
pub struct Gateway {
    latency: Duration,
    ledger: Ledger,
    /// Charges by the idempotency key the gateway itself was sent.
    by_key: Mutex<HashMap<String, Charge>>,
}

impl Gateway {
    /// A gateway whose charges take between `latency` and twice that.
    pub fn new(latency: Duration) -> Gateway {
        Gateway {
            latency,
            ledger: Ledger::default(),
            by_key: Mutex::new(HashMap::new()),
        }
    }

    /// Charges `amount` of `currency` under `key`.
    ///
    /// The charge lands in the ledger only after the simulated round trip:
    /// a call dropped while it waits has charged nothing, like a request
    /// that never reached the gateway.
    pub async fn charge(&self, key: &str, amount: i64, currency: &str) -> Charge {
        self.round_trip().await;
        let charge = Charge::new(key, amount, currency);
        self.ledger.append(charge.clone());
        charge
    }

    async fn round_trip(&self) {
        let jitter = rand::rng().random_range(0..=self.latency.as_micros() as u64);
        tokio::time::sleep(self.latency + Duration::from_micros(jitter)).await;
    }

    /// Charges like [`charge`](Gateway::charge), but once per
    /// `gateway_key`, as a payment provider's own `Idempotency-Key` does: a
    /// second call with the same key (a re-run after a crash) returns the
    /// first call's charge and charges nothing.
    pub async fn charge_once(
        &self,
        gateway_key: &str,
        key: &str,
        amount: i64,
        currency: &str,
    ) -> Charge {
        if let Some(charge) = self.known(gateway_key) {
            return charge;
        }
        self.round_trip().await;
        let mut by_key = self
            .by_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(charge) = by_key.get(gateway_key) {
            return charge.clone();
        }
        let charge = Charge::new(key, amount, currency);
        self.ledger.append(charge.clone());
        by_key.insert(gateway_key.to_owned(), charge.clone());
        charge
    }

    fn known(&self, gateway_key: &str) -> Option<Charge> {
        self.by_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(gateway_key)
            .cloned()
    }

    /// The ledger of every charge made.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
}

/// Every charge made, in order: the ground truth a retry storm is checked
/// against. It lives in memory, so it starts empty with each process.
#[derive(Debug, Default)]
pub struct Ledger {
    charges: Mutex<Vec<Charge>>,
}

impl Ledger {
    fn append(&self, charge: Charge) {
        self.lock().push(charge);
    }

    /// A copy of every charge made so far.
    pub fn charges(&self) -> Vec<Charge> {
        self.lock().clone()
    }

    /// How many charges were made.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no charge was made yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Charge>> {
        // A push either happened or it did not: a panic elsewhere while the
        // lock was held cannot leave the list half-written.
        self.charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Formats `at` as RFC 3339 in UTC with milliseconds.
fn rfc3339(at: SystemTime) -> String {
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since_epoch.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`), so timestamps need no date crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_utc() {
        let at = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
        assert_eq!(rfc3339(at), "2024-02-29T12:34:56.789Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[tokio::test]
    async fn every_charge_lands_in_the_ledger_once() {
        let gateway = Gateway::new(Duration::ZERO);
        let charge = gateway.charge("k1", 1250, "EUR").await;
        assert_eq!(gateway.ledger().charges(), vec![charge.clone()]);
        assert!(charge.id.starts_with("ch_") && charge.id.len() == 19);
    }

    #[tokio::test]
    async fn a_gateway_key_is_charged_once() {
        let gateway = Gateway::new(Duration::ZERO);
        let first = gateway.charge_once("g1", "k1", 1250, "EUR").await;
        let again = gateway.charge_once("g1", "k1", 1250, "EUR").await;
        let other = gateway.charge_once("g2", "k2", 5, "EUR").await;
        assert_eq!(first, again);
        assert_ne!(first.id, other.id);
        assert_eq!(gateway.ledger().charges(), vec![first, other]);
    }
}
