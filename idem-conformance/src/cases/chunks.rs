//! Outcomes in chunks (`idem_core::chunks`): a chunk is a settled record
//! inserted as it is; an owner's chunks read back in order and whole, lapse
//! after their record, and a stale owner's chunks are never read.

use std::time::Duration;

use idem_core::chunks::{chunk_key, read_chunk, ChunkError, Chunks, Manifest, HEAD};
use idem_core::store::{Insert, NewRecord, State, Store, Token};
use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease};
use tokio::time::Instant;

use crate::support::{
    absent, claim, fp, idempotent, live, noise, ok, pass, same_bytes, until_lease_lapsed, LEASE,
    RETENTION,
};
use crate::Factory;

/// Claims `client_key` for `request`, which the case knows to be new.
async fn run(idem: &Idempotent, client_key: &str, request: &[u8]) -> Lease {
    match idem.begin(client_key, Fingerprint::of_bytes(request)).await {
        Ok(Begin::Run(lease)) => lease,
        other => panic!("the first claim of {client_key:?} must run, got {other:?}"),
    }
}

/// Replays `client_key` and reads its manifest from the recorded payload.
async fn manifest(idem: &Idempotent, client_key: &str, request: &[u8]) -> Manifest {
    match idem.begin(client_key, Fingerprint::of_bytes(request)).await {
        Ok(Begin::Replay(replay)) => {
            Manifest::decode(replay.payload()).expect("the recorded payload is the manifest")
        }
        other => panic!("a claim of the completed {client_key:?} must replay, got {other:?}"),
    }
}

/// Reads every chunk `manifest` names.
async fn read_all(
    store: std::sync::Arc<dyn Store>,
    key: &str,
    manifest: Manifest,
) -> Result<Vec<Vec<u8>>, ChunkError> {
    let mut chunks = Chunks::new(store, key, manifest);
    let mut read = Vec::new();
    while let Some(chunk) = chunks.next().await {
        read.push(chunk?);
    }
    Ok(read)
}

/// A `Completed` record without a lease, inserted into an absent key, is
/// stored as it is: `load` and another writer's `insert` find it settled,
/// with its payload, and nothing can swap, take over or remove it.
pub async fn a_settled_insert_is_stored_as_it_is(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = chunk_key(&crate::support::key("settled-insert"), Token::random(), 0);
    let token = Token::random();
    let payload = noise(3000, 11);
    let chunk = NewRecord {
        token,
        fingerprint: fp(4),
        state: State::Completed,
        payload: &payload,
        lease: None,
        retention: RETENTION,
    };
    claim(&*store, &key, &chunk).await;
    let record = live(&*store, &key).await;
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.token, token);
    assert_eq!(record.fingerprint, fp(4));
    assert_eq!(
        record.lease_remaining, None,
        "a settled record holds no lease"
    );
    same_bytes(&record.payload, &payload, "a chunk read by load");
    // Another writer's insert; one with the same token may be taken for
    // a resend of the first and answered `Inserted`.
    let other = NewRecord {
        token: Token::random(),
        payload: b"another",
        ..chunk
    };
    match ok(store.insert(&key, &other).await, "insert") {
        Insert::Found(found) => {
            assert_eq!(found.token, token);
            same_bytes(&found.payload, &payload, "a chunk found by insert")
        }
        other => panic!("a second insert of a chunk must find it, got {other:?}"),
    }
    let claim = crate::support::in_flight(Token::random(), fp(4), LEASE);
    assert!(!ok(store.swap(&key, token, &claim).await, "swap"));
    assert!(!ok(store.take_over(&key, token, &claim).await, "take_over"));
    assert!(!ok(store.remove(&key, token).await, "remove"));
    same_bytes(
        &live(&*store, &key).await.payload,
        &payload,
        "a chunk after refused writes",
    );
}

/// Chunks of every size, an empty one and a 64 KiB one among them, read
/// back in the order they were written, byte for byte, and add up to the
/// manifest's count and length; a follower reads each as soon as it is
/// written, and the head apart from them.
pub async fn chunks_read_back_in_order_and_whole(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let idem = idempotent(store.clone());
    let lease = run(&idem, "chunked", b"stream").await;
    let sizes = [1, 0, 64 * 1024, 17, 4096, 3];
    let written: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(seed, &len)| noise(len, seed as u64 + 1))
        .collect();
    let mut writer = lease.chunk_writer();
    writer
        .write_head(b"head")
        .await
        .expect("the head is written");
    let key = lease.key().as_str().to_owned();
    let mut followed = Vec::new();
    for chunk in &written {
        writer.write(chunk).await.expect("a chunk is written");
        // A follower reads each chunk as soon as it is written.
        let index = followed.len() as u32;
        let read = read_chunk(&*store, &key, lease.token(), index).await;
        followed.push(
            read.expect("a written chunk reads")
                .expect("a written chunk is there"),
        );
    }
    let next = read_chunk(&*store, &key, lease.token(), written.len() as u32).await;
    assert!(
        matches!(next, Ok(None)),
        "a chunk not written yet is not there: {next:?}"
    );
    let head = read_chunk(&*store, &key, lease.token(), HEAD).await;
    assert_eq!(head.expect("the head reads").as_deref(), Some(&b"head"[..]));
    assert_eq!(followed, written, "what a follower read");
    let manifest = writer.manifest();
    assert_eq!(
        manifest.count() as usize,
        written.len(),
        "the head is not a chunk"
    );
    assert_eq!(manifest.len(), sizes.iter().sum::<usize>() as u64);
    lease
        .complete_chunked(&writer, &manifest.encode())
        .await
        .expect("the owner completes");
    let replayed = self::manifest(&idem, "chunked", b"stream").await;
    assert_eq!(replayed, manifest, "the replay names the chunks written");
    let read = read_all(store, lease.key().as_str(), replayed)
        .await
        .expect("every chunk reads back");
    assert_eq!(
        read.len(),
        written.len(),
        "one chunk read per chunk written"
    );
    for (index, (got, want)) in read.iter().zip(&written).enumerate() {
        same_bytes(got, want, &format!("chunk {index}"));
    }
}

/// A completed chunked record lapses no later than its chunks: right after
/// completion every chunk has at least the record's retention left, and
/// once the record has lapsed (a short retention) so have its chunks, a
/// lease later.
pub async fn chunks_lapse_after_their_record(factory: &dyn Factory) {
    // Long enough for the writes on a loaded machine and a replicated
    // store; the heartbeat keeps the claim meanwhile.
    const BRIEF: Duration = Duration::from_secs(2);
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let idem = idempotent(store.clone()).with_retention(BRIEF);
    let lease = run(&idem, "lapsing", b"stream").await;
    let mut writer = lease.chunk_writer();
    let wrote = lease
        .run(async {
            for seed in 0..3 {
                writer.write(&noise(100, seed)).await?;
            }
            Ok::<_, Error>(())
        })
        .await;
    wrote.output.expect("the chunks are written");
    assert!(!wrote.lease_lost, "nobody else claims the key");
    let manifest = writer.manifest();
    lease
        .complete_chunked(&writer, &manifest.encode())
        .await
        .expect("the owner completes");
    let completed = Instant::now();
    let key = lease.key().as_str().to_owned();
    let record = live(&*store, &key).await;
    for index in 0..manifest.count() {
        let chunk = live(&*store, &chunk_key(&key, manifest.token(), index)).await;
        assert!(
            chunk.retention_remaining >= record.retention_remaining,
            "chunk {index} has {:?} left, its record {:?}: the chunk would lapse first",
            chunk.retention_remaining,
            record.retention_remaining
        );
    }
    pass(completed, BRIEF + LEASE).await;
    absent(&*store, &key, "after the record's retention").await;
    for index in 0..manifest.count() {
        let chunk = chunk_key(&key, manifest.token(), index);
        absent(&*store, &chunk, "for a chunk past its retention").await;
    }
}

/// An owner whose key was taken over writes its chunks and tries to
/// complete: the completion is refused, and the replay reads only the new
/// owner's chunks.
pub async fn a_stale_owners_chunks_are_never_read(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let idem = idempotent(store.clone());
    let stale = run(&idem, "taken-over", b"stream").await;
    let mut stale_writer = stale.chunk_writer();
    stale_writer
        .write(b"stale first")
        .await
        .expect("a chunk is written");
    let key = stale.key().as_str().to_owned();
    until_lease_lapsed(&*store, &key).await;
    let owner = run(&idem, "taken-over", b"stream").await;
    assert_ne!(
        owner.token(),
        stale.token(),
        "a takeover brings a new token"
    );
    let mut writer = owner.chunk_writer();
    writer
        .write(b"new owner")
        .await
        .expect("a chunk is written");
    stale_writer
        .write(b"stale second")
        .await
        .expect("a stale chunk is only a record of its own");
    assert!(
        matches!(
            stale
                .complete_chunked(&stale_writer, &stale_writer.manifest().encode())
                .await,
            Err(Error::LeaseLost)
        ),
        "the stale owner's completion must be refused"
    );
    owner
        .complete_chunked(&writer, &writer.manifest().encode())
        .await
        .expect("the owner completes");
    let replayed = manifest(&idem, "taken-over", b"stream").await;
    assert_eq!(replayed.token(), owner.token());
    let read = read_all(store, &key, replayed)
        .await
        .expect("the owner's chunks read back");
    assert_eq!(
        read,
        vec![b"new owner".to_vec()],
        "only the owner's chunks are read"
    );
}
