//! Time: leases and retention are separate clocks on the store, an expired
//! record is absent everywhere, and purge removes only expired records.

use std::time::Duration;

use idem_core::store::{Insert, State, Store, Token};
use tokio::time::Instant;

use crate::support::{
    absent, claim, fp, in_flight, key, live, ok, pass, settled, short_lived, LONG, RETENTION, SLACK,
};
use crate::Factory;

const BRIEF_LEASE: Duration = Duration::from_millis(100);
const BRIEF_RETENTION: Duration = Duration::from_millis(200);

/// Claims `key` with a record that expires after [`BRIEF_RETENTION`] and
/// waits until it has.
async fn expired(store: &dyn Store, key: &str) -> Token {
    let token = Token::random();
    claim(
        store,
        key,
        &short_lived(token, BRIEF_LEASE, BRIEF_RETENTION),
    )
    .await;
    pass(Instant::now(), BRIEF_RETENTION).await;
    token
}

/// A lapsed lease does not make a record absent: it stays live and blocks
/// `insert`, with zero lease time left.
pub async fn lapsed_lease_keeps_the_record_live(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("lapsed-lease");
    let owner = Token::random();
    claim(&*store, &key, &in_flight(owner, fp(1), BRIEF_LEASE)).await;
    pass(Instant::now(), BRIEF_LEASE).await;

    let record = live(&*store, &key).await;
    assert_eq!(record.token, owner);
    assert_eq!(
        record.lease_remaining,
        Some(Duration::ZERO),
        "a lapsed lease must report zero time left"
    );
    match ok(
        store
            .insert(&key, &in_flight(Token::random(), fp(1), LONG))
            .await,
        "insert",
    ) {
        Insert::Found(found) => {
            assert_eq!(found.token, owner);
            assert_eq!(
                found.lease_remaining,
                Some(Duration::ZERO),
                "a found record whose lease lapsed must report zero lease time left"
            );
        }
        other => panic!("insert replaced a live record whose lease lapsed: {other:?}"),
    }
}

/// An expired record is absent for `load`, whatever its state.
pub async fn expired_record_is_absent_for_load(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let claimed = key("expired-load-claimed");
    let completed = key("expired-load-completed");
    claim(
        &*store,
        &claimed,
        &short_lived(Token::random(), BRIEF_LEASE, BRIEF_RETENTION),
    )
    .await;
    let token = Token::random();
    claim(&*store, &completed, &in_flight(token, fp(1), LONG)).await;
    let done = settled(token, fp(1), State::Completed, b"old", BRIEF_RETENTION);
    assert!(ok(store.swap(&completed, token, &done).await, "swap"));
    pass(Instant::now(), BRIEF_RETENTION).await;

    absent(&*store, &claimed, "for an InFlight record past retention").await;
    absent(&*store, &completed, "for a Completed record past retention").await;
}

/// `insert` over an expired record replaces it and returns `Inserted`.
pub async fn expired_record_is_replaced_by_insert(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("expired-insert");
    expired(&*store, &key).await;
    let fresh = Token::random();
    match ok(
        store.insert(&key, &in_flight(fresh, fp(2), LONG)).await,
        "insert",
    ) {
        Insert::Inserted => {}
        other => panic!("insert over an expired record must return Inserted, got {other:?}"),
    }
    let record = live(&*store, &key).await;
    assert_eq!(record.token, fresh);
    assert_eq!(record.fingerprint, fp(2));
}

/// `swap` on an expired record fails, even with its token.
pub async fn expired_record_cannot_be_swapped(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("expired-swap");
    let token = expired(&*store, &key).await;
    let done = settled(token, fp(0), State::Completed, b"late", RETENTION);
    assert!(
        !ok(store.swap(&key, token, &done).await, "swap"),
        "swap revived an expired record"
    );
    absent(&*store, &key, "after a refused swap of an expired record").await;
}

/// `take_over` of an expired record fails, even with its token.
pub async fn expired_record_cannot_be_taken_over(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("expired-take-over");
    let token = expired(&*store, &key).await;
    assert!(
        !ok(
            store
                .take_over(&key, token, &in_flight(Token::random(), fp(0), LONG))
                .await,
            "take_over"
        ),
        "take_over revived an expired record"
    );
    absent(
        &*store,
        &key,
        "after a refused take_over of an expired record",
    )
    .await;
}

/// `remove` of an expired record returns false.
pub async fn expired_record_cannot_be_removed(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("expired-remove");
    let token = expired(&*store, &key).await;
    assert!(
        !ok(store.remove(&key, token).await, "remove"),
        "remove reported deleting an expired record"
    );
}

/// Remaining lease and retention are reported, within what was asked, and
/// they count down.
pub async fn remaining_times_are_reported_within_bounds(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("remaining");
    let (lease, retention) = (Duration::from_secs(30), Duration::from_secs(60));
    let token = Token::random();
    let asked = Instant::now();
    claim(&*store, &key, &in_flight(token, fp(1), lease)).await;
    let first = live(&*store, &key).await;
    let spent = asked.elapsed() + Duration::from_millis(10);
    let lease_left = first
        .lease_remaining
        .unwrap_or_else(|| panic!("a claim reports no lease: {first:?}"));
    assert!(
        lease_left <= lease && lease_left + spent >= lease,
        "asked for a {lease:?} lease, {lease_left:?} reported left"
    );
    assert!(
        first.retention_remaining <= retention && first.retention_remaining + spent >= retention,
        "asked for {retention:?} retention, {:?} reported left",
        first.retention_remaining
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    let later = live(&*store, &key).await;
    let later_lease = later.lease_remaining.unwrap_or_default();
    assert!(
        later_lease + Duration::from_millis(150) <= lease_left,
        "the lease did not count down: {lease_left:?} then {later_lease:?} 200 ms later"
    );
    assert!(
        later.retention_remaining + Duration::from_millis(150) <= first.retention_remaining,
        "retention did not count down: {:?} then {:?} 200 ms later",
        first.retention_remaining,
        later.retention_remaining
    );

    let kept = Duration::from_secs(45);
    let completing = Instant::now();
    assert!(ok(
        store
            .swap(
                &key,
                token,
                &settled(token, fp(1), State::Completed, b"", kept)
            )
            .await,
        "swap"
    ));
    let done = live(&*store, &key).await;
    let spent = completing.elapsed() + Duration::from_millis(10);
    assert_eq!(
        done.lease_remaining, None,
        "a completed record reports a lease"
    );
    assert!(
        done.retention_remaining <= kept && done.retention_remaining + spent >= kept,
        "completed with {kept:?} retention, {:?} reported left",
        done.retention_remaining
    );
}

/// Lease and retention are separate clocks, and a swap restarts retention
/// from now.
pub async fn lease_and_retention_are_separate_clocks(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let retention = Duration::from_millis(600);
    // Each step must happen inside a window; a machine too slow to hit one
    // makes the round inconclusive, and one of a few rounds decides.
    for round in 0..4 {
        let key = key(&format!("separate-clocks-{round}"));
        let token = Token::random();
        let claiming = Instant::now();
        claim(&*store, &key, &short_lived(token, BRIEF_LEASE, retention)).await;
        let claimed = Instant::now();
        pass(claimed, BRIEF_LEASE).await;

        let lapsed = ok(store.load(&key).await, "load");
        if claiming.elapsed() + SLACK >= retention {
            continue;
        }
        let lapsed = lapsed.unwrap_or_else(|| panic!("the record expired with its {BRIEF_LEASE:?} lease, not its {retention:?} retention"));
        assert_eq!(
            lapsed.lease_remaining,
            Some(Duration::ZERO),
            "the lease should have lapsed"
        );
        assert!(
            lapsed.retention_remaining > Duration::ZERO,
            "retention ran out with the lease"
        );

        let completing = Instant::now();
        let done = settled(token, fp(0), State::Completed, b"kept", retention);
        let swapped = ok(store.swap(&key, token, &done).await, "swap");
        let completed = Instant::now();
        if !swapped && claiming.elapsed() >= retention {
            continue;
        }
        assert!(
            swapped,
            "the owner could not complete after its lease lapsed"
        );

        // Past the claim's retention deadline, within the completion's.
        pass(claimed, retention).await;
        let record = ok(store.load(&key).await, "load");
        if completing.elapsed() >= retention {
            continue;
        }
        match record {
            Some(record) => assert_eq!(record.payload, b"kept"),
            None => {
                panic!("a completed record expired on the claim's retention clock, not its own")
            }
        }
        pass(completed, retention).await;
        absent(&*store, &key, "after the completed record's own retention").await;
        return;
    }
    panic!("the machine was too slow to check retention windows of {retention:?} in every round");
}

/// `purge_expired` deletes expired records and never a live one, whatever
/// its state: InFlight with a live or a lapsed lease, Completed, Failed,
/// and a record whose claim's retention has passed but whose completion
/// restarted it.
pub async fn purge_expired_deletes_expired_records_only(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let mut doomed = Vec::new();
    for n in 0..4 {
        let key = key(&format!("purge-expired-{n}"));
        claim(
            &*store,
            &key,
            &short_lived(Token::random(), BRIEF_LEASE, BRIEF_RETENTION),
        )
        .await;
        doomed.push(key);
    }
    let mut kept = Vec::new();
    for (n, lease) in [Duration::from_millis(50), LONG].into_iter().enumerate() {
        let key = key(&format!("purge-live-{n}"));
        let token = Token::random();
        claim(&*store, &key, &in_flight(token, fp(1), lease)).await;
        kept.push((key, token));
    }
    for state in [State::Completed, State::Failed] {
        let key = key(&format!("purge-live-{state:?}"));
        let token = Token::random();
        claim(&*store, &key, &in_flight(token, fp(1), LONG)).await;
        assert!(ok(
            store
                .swap(
                    &key,
                    token,
                    &settled(token, fp(1), state, b"kept", RETENTION)
                )
                .await,
            "swap"
        ));
        kept.push((key, token));
    }
    // Claimed to vanish with the doomed records, then completed: only the
    // completion's retention counts.
    let key = key("purge-live-completed-late");
    let token = Token::random();
    claim(
        &*store,
        &key,
        &short_lived(token, BRIEF_LEASE, BRIEF_RETENTION),
    )
    .await;
    let done = settled(token, fp(0), State::Completed, b"kept", RETENTION);
    let completed = ok(store.swap(&key, token, &done).await, "swap");
    pass(Instant::now(), BRIEF_RETENTION).await;
    if completed {
        kept.push((key, token));
    }

    // Other fixtures may share the backend's table or keyspace, so counts
    // are bounded, not exact.
    let limit = 1000;
    for _ in 0..100 {
        let purged = ok(store.purge_expired(limit).await, "purge_expired");
        assert!(
            purged <= limit,
            "purge_expired({limit}) reported {purged} deletions"
        );
        if purged < limit {
            break;
        }
    }
    for (key, token) in &kept {
        assert_eq!(
            live(&*store, key).await.token,
            *token,
            "purge_expired touched the live record {key:?}"
        );
    }
    for key in &doomed {
        absent(&*store, key, "for an expired record after purge").await;
    }
}

/// `purge_expired` deletes at most `limit` records per call.
pub async fn purge_expired_respects_its_limit(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    for n in 0..5 {
        let key = key(&format!("purge-limit-{n}"));
        claim(
            &*store,
            &key,
            &short_lived(Token::random(), BRIEF_LEASE, BRIEF_RETENTION),
        )
        .await;
    }
    pass(Instant::now(), BRIEF_RETENTION).await;
    assert_eq!(
        ok(store.purge_expired(0).await, "purge_expired"),
        0,
        "purge_expired(0) deleted records"
    );
    let purged = ok(store.purge_expired(2).await, "purge_expired");
    assert!(purged <= 2, "purge_expired(2) reported {purged} deletions");
}

/// `purge_expired` deletes every record past retention, reports each
/// deletion, and returns less than its limit only once none is left:
/// records must not pile up in the backend. Needs the fixture's
/// [`stored_count`](crate::Fixture::stored_count).
pub async fn purge_expired_leaves_no_expired_record_stored(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let stored = || async {
        fixture.stored_count().await.unwrap_or_else(|| {
            panic!(
                "this case counts the records stored in the backend, expired ones \
                 included: give the fixture Fixture::with_stored_count"
            )
        })
    };
    // Whatever the backend keeps beside records (an index, a version key)
    // is part of the baseline.
    let baseline = stored().await;
    let live = live_records_of_every_kind(&*store).await;
    assert_eq!(
        stored().await,
        baseline + live,
        "the fixture's stored_count does not count the {live} records just written"
    );

    const DOOMED: usize = 5;
    // Long enough to count the doomed records while they are live on a
    // loaded machine; a round too slow for that skips only that check.
    let retention = Duration::from_millis(500);
    let claiming = Instant::now();
    for n in 0..DOOMED {
        let key = key(&format!("pile-doomed-{n}"));
        let record = short_lived(Token::random(), BRIEF_LEASE, retention);
        claim(&*store, &key, &record).await;
    }
    let claimed = Instant::now();
    let counted = stored().await;
    if claiming.elapsed() + SLACK < retention {
        assert_eq!(
            counted,
            baseline + live + DOOMED,
            "the fixture's stored_count does not count the {DOOMED} records just claimed"
        );
    }
    pass(claimed, retention).await;

    let before = stored().await;
    let limit = 2;
    let mut reported = 0;
    for _ in 0..100 {
        let purged = ok(store.purge_expired(limit).await, "purge_expired");
        assert!(
            purged <= limit,
            "purge_expired({limit}) reported {purged} deletions"
        );
        reported += purged;
        if purged < limit {
            break;
        }
    }
    let after = stored().await;
    assert_eq!(
        after,
        baseline + live,
        "{} expired records are still stored after purge_expired returned less than \
         its limit ({} live records and a baseline of {baseline})",
        after.saturating_sub(baseline + live),
        live
    );
    let went = before.saturating_sub(after);
    assert_eq!(
        reported, went,
        "purge_expired reported {reported} deletions; {went} records went"
    );
}

/// Writes live records of every kind that `purge_expired` must keep and
/// returns how many: InFlight with a live and a lapsed lease, Completed,
/// Failed.
async fn live_records_of_every_kind(store: &dyn Store) -> usize {
    let mut written = 0;
    for (n, lease) in [BRIEF_LEASE, LONG].into_iter().enumerate() {
        let key = key(&format!("pile-live-{n}"));
        claim(store, &key, &in_flight(Token::random(), fp(1), lease)).await;
        written += 1;
    }
    for state in [State::Completed, State::Failed] {
        let key = key(&format!("pile-live-{state:?}"));
        let token = Token::random();
        claim(store, &key, &in_flight(token, fp(1), LONG)).await;
        let done = settled(token, fp(1), state, b"kept", RETENTION);
        assert!(ok(store.swap(&key, token, &done).await, "swap"));
        written += 1;
    }
    written
}
