//! Batches built by hand, so that which operations share a transaction is
//! certain rather than left to timing.

use std::time::Duration;

use idem_core::store::{Insert, NewRecord, State, Token};
use idem_core::Fingerprint;
use tokio::sync::oneshot;

use super::{Job, Setting, Settings, Writer};
use crate::error::Failure;
use crate::ops::{Done, Op};
use crate::schema::{self, Target};
use crate::Synchronous;

fn writer() -> Writer {
    let settings = Settings {
        busy_timeout: Duration::from_secs(1),
        max_batch: 64,
        synchronous: Synchronous::Full,
        cache_bytes: crate::DEFAULT_CACHE_BYTES,
    };
    let conn = schema::connect(&Target::Memory, &settings).expect("an in-memory database opens");
    schema::migrate(&conn, settings.busy_timeout).expect("the schema is created");
    Writer::new(
        conn,
        settings,
        std::sync::Arc::new(idem_core::store::Wakeups::new()),
    )
}

fn in_flight(token: Token) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint: Fingerprint::of_bytes(b"body"),
        state: State::InFlight,
        payload: b"",
        lease: Some(Duration::from_secs(60)),
        retention: Duration::from_secs(3600),
    }
}

fn insert(key: &str, token: Token) -> Op {
    Op::Insert {
        key: key.to_owned(),
        record: (&in_flight(token)).into(),
    }
}

/// Runs `ops` as one batch and returns their answers in order.
fn batch(writer: &mut Writer, ops: Vec<Op>) -> Vec<Result<Done, Failure>> {
    let (jobs, answers): (Vec<_>, Vec<_>) = ops
        .into_iter()
        .map(|op| {
            let (reply, answer) = oneshot::channel();
            (Job { op, reply }, answer)
        })
        .unzip();
    writer.execute(jobs);
    answers
        .into_iter()
        .map(|mut answer| answer.try_recv().expect("every job is answered"))
        .collect()
}

fn is_inserted(answer: &Result<Done, Failure>) -> bool {
    matches!(answer, Ok(Done::Insert(Insert::Inserted)))
}

/// A statement that fails inside a batch fails alone: the jobs before and
/// after it are still applied and answered as if it had never been sent.
#[test]
fn a_failing_statement_does_not_spoil_its_batch() {
    let mut writer = writer();
    writer
        .conn
        .execute_batch(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON idem_records
             WHEN NEW.key = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END;",
        )
        .expect("the trigger is created");
    let answers = batch(
        &mut writer,
        vec![
            insert("a", Token::random()),
            insert("poison", Token::random()),
            insert("b", Token::random()),
            Op::Load { key: "a".into() },
        ],
    );
    assert!(is_inserted(&answers[0]), "{:?}", answers[0]);
    match &answers[1] {
        Err(failure) => assert!(failure.to_string().contains("poison refused"), "{failure}"),
        other => panic!("the poisoned insert must fail, got {other:?}"),
    }
    assert!(is_inserted(&answers[2]), "{:?}", answers[2]);
    assert!(
        matches!(&answers[3], Ok(Done::Loaded(Some(_)))),
        "{:?}",
        answers[3]
    );
    let kept: i64 = writer
        .conn
        .query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
        .expect("the table reads");
    assert_eq!(kept, 2, "a and b are committed, poison is not");
}

/// Jobs of one batch on one key see each other in order, exactly as if
/// they had run one by one.
#[test]
fn jobs_on_one_key_in_a_batch_apply_in_order() {
    let mut writer = writer();
    let (first, second) = (Token::random(), Token::random());
    let completed = NewRecord {
        state: State::Completed,
        payload: b"done",
        lease: None,
        ..in_flight(first)
    };
    let answers = batch(
        &mut writer,
        vec![
            insert("k", first),
            insert("k", second),
            Op::Swap {
                key: "k".into(),
                expected: second,
                record: (&completed).into(),
                take_over: false,
            },
            Op::Swap {
                key: "k".into(),
                expected: first,
                record: (&completed).into(),
                take_over: false,
            },
            Op::Remove {
                key: "k".into(),
                expected: first,
            },
            Op::Load { key: "k".into() },
        ],
    );
    assert!(is_inserted(&answers[0]));
    match &answers[1] {
        Ok(Done::Insert(Insert::Found(found))) => assert_eq!(found.token, first),
        other => panic!("the second insert must find the first, got {other:?}"),
    }
    assert!(
        matches!(answers[2], Ok(Done::Changed(false))),
        "wrong token"
    );
    assert!(matches!(answers[3], Ok(Done::Changed(true))), "right token");
    assert!(
        matches!(answers[4], Ok(Done::Changed(false))),
        "completed is final"
    );
    match &answers[5] {
        Ok(Done::Loaded(Some(record))) => {
            assert_eq!(record.state, State::Completed);
            assert_eq!(record.payload, b"done");
        }
        other => panic!("the record must be completed, got {other:?}"),
    }
}

/// A row that does not decode is that job's corrupt error; the jobs around
/// it are committed.
#[test]
fn a_bad_row_fails_only_the_job_that_reads_it() {
    let mut writer = writer();
    writer
        .conn
        .execute(
            "INSERT INTO idem_records VALUES ('bad', x'00', zeroblob(32), 0, x'', NULL, ?1)",
            [i64::MAX],
        )
        .expect("the bad row is written");
    let answers = batch(
        &mut writer,
        vec![
            insert("x", Token::random()),
            Op::Load { key: "bad".into() },
            insert("y", Token::random()),
        ],
    );
    assert!(is_inserted(&answers[0]));
    match &answers[1] {
        Err(failure @ Failure::BadRow(_)) => {
            assert!(
                failure.to_string().contains("a token is 16 bytes, not 1"),
                "{failure}"
            )
        }
        other => panic!("the bad row must be a corrupt error, got {other:?}"),
    }
    assert!(is_inserted(&answers[2]));
}

/// A claim whose caller stopped waiting is skipped, so it blocks nobody;
/// a completion whose caller stopped waiting still runs, since its work
/// has happened.
#[test]
fn abandoned_claims_are_skipped_but_abandoned_completions_run() {
    let mut writer = writer();
    let token = Token::random();
    assert!(is_inserted(
        &batch(&mut writer, vec![insert("held", token)])[0]
    ));
    let completed = NewRecord {
        state: State::Completed,
        payload: b"done",
        lease: None,
        ..in_flight(token)
    };
    let abandoned = |op| {
        let (reply, answer) = oneshot::channel();
        drop(answer);
        Job { op, reply }
    };
    writer.execute(vec![
        abandoned(insert("claimed", Token::random())),
        abandoned(Op::Swap {
            key: "held".into(),
            expected: token,
            record: (&completed).into(),
            take_over: false,
        }),
    ]);
    let answers = batch(
        &mut writer,
        vec![
            Op::Load {
                key: "claimed".into(),
            },
            Op::Load { key: "held".into() },
        ],
    );
    assert!(
        matches!(answers[0], Ok(Done::Loaded(None))),
        "{:?}",
        answers[0]
    );
    match &answers[1] {
        Ok(Done::Loaded(Some(record))) => assert_eq!(record.state, State::Completed),
        other => panic!("the completion must have run, got {other:?}"),
    }
}

/// The page cache starts at the store's default and follows the setting.
#[test]
fn the_page_cache_follows_the_setting() {
    let mut writer = writer();
    let kib = |writer: &Writer| -> i64 {
        writer
            .conn
            .pragma_query_value(None, "cache_size", |row| row.get(0))
            .unwrap()
    };
    assert_eq!(kib(&writer), -((crate::DEFAULT_CACHE_BYTES / 1024) as i64));
    writer.configure(Setting::CacheSize(8 << 20));
    assert_eq!(kib(&writer), -8192);
    writer.configure(Setting::CacheSize(0));
    assert_eq!(kib(&writer), -1);
    assert!(writer.broken.is_none());
}

/// Memory-mapped I/O is off until asked for, and then follows the setting.
#[test]
fn memory_mapping_is_off_until_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        busy_timeout: Duration::from_secs(1),
        max_batch: 64,
        synchronous: Synchronous::Full,
        cache_bytes: crate::DEFAULT_CACHE_BYTES,
    };
    let conn = schema::connect(&Target::File(dir.path().join("m.db")), &settings).unwrap();
    let mut writer = Writer::new(
        conn,
        settings,
        std::sync::Arc::new(idem_core::store::Wakeups::new()),
    );
    let mapped = |writer: &Writer| -> i64 {
        writer
            .conn
            .pragma_query_value(None, "mmap_size", |row| row.get(0))
            .unwrap()
    };
    assert_eq!(mapped(&writer), 0);
    writer.configure(Setting::MmapSize(64 << 20));
    assert_eq!(mapped(&writer), 64 << 20);
    writer.configure(Setting::MmapSize(0));
    assert_eq!(mapped(&writer), 0);
    assert!(writer.broken.is_none());
}
