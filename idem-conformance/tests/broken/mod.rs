//! A map store like `MemoryStore`, with one deliberate flaw switched on:
//! the kit must catch each. Every flaw breaks one clause of the `Store`
//! contract and nothing else; the table in the kit's `CONTRACT.md` names the
//! clause and the case that catches it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};
use idem_core::Fingerprint;
use tokio::time::Instant;

/// The bug a [`FlawedStore`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// None: the control, which must pass everything.
    None,
    /// `insert` looks, yields, then writes: two racing claims both win.
    CheckThenInsert,
    /// `swap` replaces an InFlight record whatever the token.
    SwapIgnoresToken,
    /// `remove` deletes an InFlight record whatever the token.
    RemoveIgnoresToken,
    /// Records past retention are still returned and still block claims.
    ExpiredIsLive,
    /// Leases never lapse: `take_over` always fails and the lease left never
    /// reaches zero.
    LeasesNeverLapse,
    /// `take_over` does not check the lease: a live owner loses its key.
    TakeOverIgnoresLease,
    /// Payloads over 1 MiB are cut to 1 MiB, as a column size limit would.
    TruncatesPayloads,
    /// Payloads are stored as text, so bytes that are not UTF-8 are replaced.
    StoresPayloadsAsText,

    // Time.
    /// `insert`'s `Found` reports the durations the record was written
    /// with, not the time left now.
    FoundReportsGivenTimes,
    /// `insert`'s `Found` reports the least time above zero for the lease
    /// as well as the retention: a lower bound is allowed for a settled
    /// record's retention only, and a short lease takes over a live owner.
    FoundReportsLowerBounds,
    /// `load` reports the durations the record was written with.
    LoadReportsGivenTimes,
    /// A renewal (a `swap` that keeps the record InFlight) moves the lease
    /// deadline but keeps the claim's retention deadline, so heartbeating
    /// work outlives its record.
    RenewalKeepsRetention,
    /// A renewal keeps the claim's lease deadline.
    RenewalKeepsLease,
    /// A completing `swap` keeps the claim's retention deadline.
    CompletionKeepsRetention,
    /// `take_over` installs the new owner with the old owner's lease
    /// deadline.
    TakeOverKeepsLeaseDeadline,

    // Liveness.
    /// A claim is kept only as long as its lease, as a key written with
    /// the lease as its TTL would be.
    ClaimExpiresWithItsLease,
    /// `insert` replaces an InFlight record whose lease lapsed.
    InsertReplacesLapsedLease,
    /// `insert` finds a record past retention instead of replacing it.
    InsertFindsExpired,
    /// `load` returns a record past retention.
    LoadReturnsExpired,
    /// `swap` completes a record past retention.
    SwapRevivesExpired,
    /// `take_over` wins a record past retention.
    TakeOverRevivesExpired,
    /// `remove` reports deleting a record past retention.
    RemoveReportsExpired,
    /// `purge_expired` also deletes InFlight records whose lease lapsed.
    PurgeDeletesLapsedLeases,
    /// `purge_expired` also deletes live Failed records.
    PurgeDeletesFailed,
    /// `purge_expired` judges a record by the retention it was claimed
    /// with, as a purge reading a column that `swap` never updates would.
    PurgeByClaimRetention,
    /// `purge_expired` ignores its limit.
    PurgeIgnoresLimit,
    /// `purge_expired` deletes nothing and reports 0, as a store relying
    /// on a backend expiry it does not have would: records pile up.
    PurgeDeletesNothing,
    /// `purge_expired` deletes one record a call whatever its limit, so a
    /// purger that stops at a call short of the limit leaves the rest.
    PurgeStopsShort,
    /// `purge_expired` deletes but reports 0, so a purger stops after one
    /// call.
    PurgeReportsNothing,

    // Atomicity.
    /// `swap` checks, yields, then writes without checking again.
    SwapCheckThenWrite,
    /// `take_over` checks, yields, then writes without checking again.
    TakeOverCheckThenWrite,
    /// `remove` checks, yields, then deletes without checking again.
    RemoveCheckThenDelete,

    // Fencing.
    /// `take_over` wins a lapsed lease whatever the token.
    TakeOverIgnoresToken,
    /// `swap` changes Completed and Failed records too.
    SwapChangesFinalRecords,
    /// `take_over` replaces any record but a Completed one: a remembered
    /// failure is taken over and its work runs again.
    TakeOverReplacesFailed,
    /// `remove` deletes any record but a Completed one.
    RemoveDeletesFailed,
    /// `insert` treats a Failed record as absent.
    InsertReplacesFailed,
    /// `swap` refuses an owner whose lease lapsed, though nobody took over.
    SwapRefusesLapsedLease,

    // Fidelity.
    /// An empty payload is stored as nothing and read back as corrupt.
    EmptyPayloadIsCorrupt,
    /// Only the first 8 bytes of a token are kept.
    TruncatesTokens,
    /// Only the first 16 bytes of a fingerprint are kept.
    TruncatesFingerprints,
    /// A fingerprint's scheme is dropped: every record reads back as
    /// scheme 1, as a store that keeps only the 32-byte digest would.
    DropsFingerprintScheme,
    /// Keys are compared without case, as a case-insensitive collation does.
    FoldsKeyCase,
    /// Keys are cut to 255 bytes, as a `VARCHAR(255)` column would.
    TruncatesKeys,

    // Reset.
    /// `reset` deletes any live record, an InFlight one too.
    ResetDeletesInFlight,
    /// `reset` takes only Completed records for settled: a Failed one is
    /// reported in flight and kept.
    ResetSkipsFailed,
    /// `reset` reports deleting a record past retention.
    ResetReportsExpired,
    /// `reset` checks, yields, then deletes whatever is there.
    ResetCheckThenDelete,
    /// `reset` rewrites the record as a claim whose lease has lapsed, with
    /// the token it held, so that the next caller takes it over: the last
    /// owner's late completion lands again.
    ResetRewritesAsLapsedClaim,
}

#[derive(Debug, Clone)]
struct Entry {
    token: Token,
    fingerprint: Fingerprint,
    state: State,
    payload: Vec<u8>,
    lease_until: Option<Instant>,
    retain_until: Instant,
    /// The retention deadline of the claim that started this record.
    claim_retain_until: Instant,
    /// The durations the record was written with.
    given: (Option<Duration>, Duration),
}

/// A map behind a mutex with one [`Flaw`].
#[derive(Debug)]
pub(crate) struct FlawedStore {
    flaw: Flaw,
    records: Mutex<HashMap<String, Entry>>,
}

/// How a method replaces a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Claim,
    Swap,
    TakeOver,
}

impl FlawedStore {
    pub(crate) fn new(flaw: Flaw) -> FlawedStore {
        FlawedStore {
            flaw,
            records: Mutex::default(),
        }
    }

    /// How many records the map holds, past retention or not.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn has(&self, flaw: Flaw) -> bool {
        self.flaw == flaw
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key as the flawed backend keeps it.
    fn stored_key(&self, key: &str) -> String {
        match self.flaw {
            Flaw::FoldsKeyCase => key.to_lowercase(),
            Flaw::TruncatesKeys => {
                let mut end = key.len().min(255);
                while !key.is_char_boundary(end) {
                    end -= 1;
                }
                key[..end].to_owned()
            }
            _ => key.to_owned(),
        }
    }

    /// The entry `record` makes when written by `how` over `old`.
    fn entry(
        &self,
        record: &NewRecord<'_>,
        now: Instant,
        how: Write,
        old: Option<&Entry>,
    ) -> Entry {
        let payload = match self.flaw {
            Flaw::TruncatesPayloads => record.payload[..record.payload.len().min(1 << 20)].to_vec(),
            Flaw::StoresPayloadsAsText => String::from_utf8_lossy(record.payload)
                .into_owned()
                .into_bytes(),
            _ => record.payload.to_vec(),
        };
        let mut token = *record.token.as_bytes();
        if self.has(Flaw::TruncatesTokens) {
            token[8..].fill(0);
        }
        let mut fingerprint = *record.fingerprint.as_bytes();
        if self.has(Flaw::TruncatesFingerprints) {
            fingerprint[16..].fill(0);
        }
        let mut lease_until = record.lease.map(|lease| now + lease);
        let mut retain_until = now + record.retention;
        if let Some(old) = old {
            let renewal = how == Write::Swap && record.state == State::InFlight;
            let completion = how == Write::Swap && record.state != State::InFlight;
            if (renewal && self.has(Flaw::RenewalKeepsRetention))
                || (completion && self.has(Flaw::CompletionKeepsRetention))
            {
                retain_until = old.retain_until;
            }
            if (renewal && self.has(Flaw::RenewalKeepsLease))
                || (how == Write::TakeOver && self.has(Flaw::TakeOverKeepsLeaseDeadline))
            {
                lease_until = old.lease_until;
            }
        }
        if how == Write::Claim && self.has(Flaw::ClaimExpiresWithItsLease) {
            retain_until = lease_until.unwrap_or(retain_until);
        }
        let claim_retain_until = match old {
            Some(old) if how == Write::Swap => old.claim_retain_until,
            _ => retain_until,
        };
        Entry {
            token: Token::from_bytes(token),
            fingerprint: if self.has(Flaw::DropsFingerprintScheme) {
                Fingerprint::from_bytes(fingerprint)
            } else {
                Fingerprint::from_digest(record.fingerprint.scheme(), fingerprint)
            },
            state: record.state,
            payload,
            lease_until,
            retain_until,
            claim_retain_until,
            given: (record.lease, record.retention),
        }
    }

    fn is_live(&self, entry: &Entry, now: Instant) -> bool {
        self.has(Flaw::ExpiredIsLive) || now < entry.retain_until
    }

    /// Whether `entry` is live for a method that `tolerates` a given flaw.
    fn live_for(&self, entry: &Entry, now: Instant, revives: Flaw) -> bool {
        self.has(revives) || self.is_live(entry, now)
    }

    fn record(&self, entry: &Entry, now: Instant, given: bool) -> Result<Record, StoreError> {
        if self.has(Flaw::EmptyPayloadIsCorrupt)
            && entry.payload.is_empty()
            && entry.state != State::InFlight
        {
            return Err(StoreError::corrupt("flawed", "no payload column"));
        }
        let lease_remaining = entry.lease_until.map(|until| match self.flaw {
            Flaw::LeasesNeverLapse => until
                .saturating_duration_since(now)
                .max(Duration::from_millis(1)),
            _ => until.saturating_duration_since(now),
        });
        let retention_remaining = entry.retain_until.saturating_duration_since(now);
        let (lease_remaining, retention_remaining) = if given {
            entry.given
        } else {
            (lease_remaining, retention_remaining)
        };
        Ok(Record {
            token: entry.token,
            fingerprint: entry.fingerprint,
            state: entry.state,
            payload: entry.payload.clone(),
            lease_remaining,
            retention_remaining,
        })
    }

    /// Whether a holder of `expected` may change `entry`: live, InFlight
    /// (unless the flaw lets `final_flaw` through) and holding the token
    /// (unless `token_checked` is false).
    fn owned(
        &self,
        entry: Option<&Entry>,
        expected: Token,
        token_checked: bool,
        now: Instant,
        (revives, final_flaw): (Flaw, Flaw),
    ) -> bool {
        entry.is_some_and(|entry| {
            let state_ok = match final_flaw {
                Flaw::SwapChangesFinalRecords if self.has(final_flaw) => true,
                Flaw::TakeOverReplacesFailed | Flaw::RemoveDeletesFailed
                    if self.has(final_flaw) =>
                {
                    entry.state != State::Completed
                }
                _ => entry.state == State::InFlight,
            };
            self.live_for(entry, now, revives)
                && state_ok
                && (!token_checked || entry.token == expected)
        })
    }

    fn lapsed(&self, entry: Option<&Entry>, now: Instant) -> bool {
        self.has(Flaw::TakeOverIgnoresLease)
            || entry.is_some_and(|e| e.lease_until.is_none_or(|until| now >= until))
    }
}

#[async_trait]
impl Store for FlawedStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let key = self.stored_key(key);
        let blocks = |entry: &Entry, now: Instant| {
            (self.is_live(entry, now) || self.has(Flaw::InsertFindsExpired))
                && !(self.has(Flaw::InsertReplacesLapsedLease)
                    && entry.state == State::InFlight
                    && entry.lease_until.is_some_and(|until| now >= until))
                && !(self.has(Flaw::InsertReplacesFailed) && entry.state == State::Failed)
        };
        let given = self.has(Flaw::FoundReportsGivenTimes);
        if self.has(Flaw::CheckThenInsert) {
            let now = Instant::now();
            if let Some(entry) = self.lock().get(&key).filter(|e| blocks(e, now)) {
                return Ok(Insert::Found(self.record(entry, now, given)?));
            }
            tokio::task::yield_now().await;
            let entry = self.entry(record, Instant::now(), Write::Claim, None);
            self.lock().insert(key, entry);
            return Ok(Insert::Inserted);
        }
        let now = Instant::now();
        let mut records = self.lock();
        match records.get(&key) {
            Some(entry) if blocks(entry, now) => {
                let mut found = self.record(entry, now, given)?;
                if self.has(Flaw::FoundReportsLowerBounds) {
                    let least = Duration::from_millis(1);
                    found.lease_remaining = found.lease_remaining.map(|_| least);
                    found.retention_remaining = least;
                }
                Ok(Insert::Found(found))
            }
            _ => {
                let entry = self.entry(record, now, Write::Claim, None);
                records.insert(key, entry);
                Ok(Insert::Inserted)
            }
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let key = self.stored_key(key);
        let checked = !self.has(Flaw::SwapIgnoresToken);
        let flaws = (Flaw::SwapRevivesExpired, Flaw::SwapChangesFinalRecords);
        let allowed = |records: &HashMap<String, Entry>, now: Instant| {
            let entry = records.get(&key);
            self.owned(entry, expected, checked, now, flaws)
                && !(self.has(Flaw::SwapRefusesLapsedLease) && self.lapsed(entry, now))
        };
        if self.has(Flaw::SwapCheckThenWrite) {
            if !allowed(&self.lock(), Instant::now()) {
                return Ok(false);
            }
            tokio::task::yield_now().await;
            let now = Instant::now();
            let mut records = self.lock();
            let entry = self.entry(record, now, Write::Swap, records.get(&key));
            records.insert(key, entry);
            return Ok(true);
        }
        let now = Instant::now();
        let mut records = self.lock();
        if !allowed(&records, now) {
            return Ok(false);
        }
        let entry = self.entry(record, now, Write::Swap, records.get(&key));
        records.insert(key, entry);
        Ok(true)
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if self.has(Flaw::LeasesNeverLapse) {
            return Ok(false);
        }
        let key = self.stored_key(key);
        let checked = !self.has(Flaw::TakeOverIgnoresToken);
        let flaws = (Flaw::TakeOverRevivesExpired, Flaw::TakeOverReplacesFailed);
        let allowed = |records: &HashMap<String, Entry>, now: Instant| {
            let entry = records.get(&key);
            self.lapsed(entry, now) && self.owned(entry, expected, checked, now, flaws)
        };
        if self.has(Flaw::TakeOverCheckThenWrite) {
            if !allowed(&self.lock(), Instant::now()) {
                return Ok(false);
            }
            tokio::task::yield_now().await;
            let now = Instant::now();
            let mut records = self.lock();
            let entry = self.entry(record, now, Write::TakeOver, records.get(&key));
            records.insert(key, entry);
            return Ok(true);
        }
        let now = Instant::now();
        let mut records = self.lock();
        if !allowed(&records, now) {
            return Ok(false);
        }
        let entry = self.entry(record, now, Write::TakeOver, records.get(&key));
        records.insert(key, entry);
        Ok(true)
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let key = self.stored_key(key);
        let checked = !self.has(Flaw::RemoveIgnoresToken);
        let flaws = (Flaw::RemoveReportsExpired, Flaw::RemoveDeletesFailed);
        if self.has(Flaw::RemoveCheckThenDelete) {
            let allowed = self.owned(
                self.lock().get(&key),
                expected,
                checked,
                Instant::now(),
                flaws,
            );
            if !allowed {
                return Ok(false);
            }
            tokio::task::yield_now().await;
            self.lock().remove(&key);
            return Ok(true);
        }
        let now = Instant::now();
        let mut records = self.lock();
        if !self.owned(records.get(&key), expected, checked, now, flaws) {
            return Ok(false);
        }
        records.remove(&key);
        Ok(true)
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let key = self.stored_key(key);
        let now = Instant::now();
        let records = self.lock();
        let given = self.has(Flaw::LoadReportsGivenTimes);
        records
            .get(&key)
            .filter(|entry| self.live_for(entry, now, Flaw::LoadReturnsExpired))
            .map(|entry| self.record(entry, now, given))
            .transpose()
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let key = self.stored_key(key);
        let answer = |entry: Option<&Entry>, now: Instant| match entry {
            Some(entry) if self.live_for(entry, now, Flaw::ResetReportsExpired) => {
                match entry.state {
                    State::InFlight if !self.has(Flaw::ResetDeletesInFlight) => Reset::InFlight,
                    State::Failed if self.has(Flaw::ResetSkipsFailed) => Reset::InFlight,
                    state => Reset::Deleted(state),
                }
            }
            _ => Reset::Absent,
        };
        if self.has(Flaw::ResetCheckThenDelete) {
            let found = answer(self.lock().get(&key), Instant::now());
            if !matches!(found, Reset::Deleted(_)) {
                return Ok(found);
            }
            tokio::task::yield_now().await;
            self.lock().remove(&key);
            return Ok(found);
        }
        let now = Instant::now();
        let mut records = self.lock();
        let found = answer(records.get(&key), now);
        if matches!(found, Reset::Deleted(_)) {
            match records.get_mut(&key) {
                Some(entry) if self.has(Flaw::ResetRewritesAsLapsedClaim) => {
                    entry.state = State::InFlight;
                    entry.payload.clear();
                    entry.lease_until = Some(now);
                }
                _ => {
                    records.remove(&key);
                }
            }
        }
        Ok(found)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        let doomed = |entry: &Entry| match self.flaw {
            Flaw::PurgeDeletesLapsedLeases
                if entry.lease_until.is_some_and(|until| now >= until) =>
            {
                true
            }
            Flaw::PurgeDeletesFailed if entry.state == State::Failed => true,
            Flaw::PurgeByClaimRetention => now >= entry.claim_retain_until,
            _ => !self.is_live(entry, now),
        };
        let limit = match self.flaw {
            Flaw::PurgeIgnoresLimit => usize::MAX,
            Flaw::PurgeDeletesNothing => 0,
            Flaw::PurgeStopsShort => limit.min(1),
            _ => limit,
        };
        let expired: Vec<String> = records
            .iter()
            .filter(|(_, entry)| doomed(entry))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &expired {
            records.remove(key);
        }
        if self.has(Flaw::PurgeReportsNothing) {
            return Ok(0);
        }
        Ok(expired.len())
    }
}
