//! Outcomes larger than one record: written in chunks while the work
//! produces them, and read back one chunk at a time, so that memory stays
//! bounded whatever the outcome's size.
//!
//! An owner writes its chunks with a [`ChunkWriter`] from its
//! [`Lease::chunk_writer`], then completes the key with a payload of its own
//! encoding that carries the writer's [`Manifest`]
//! ([`Lease::complete_chunked`]). A replay decodes the manifest from that
//! payload and reads the chunks with [`Chunks`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_core::Error> {
//! use idem_core::chunks::{Chunks, Manifest};
//! use idem_core::{Begin, Fingerprint, Idempotent, MemoryStore};
//!
//! let idem = Idempotent::new(MemoryStore::new());
//! let Begin::Run(lease) = idem.begin("k", Fingerprint::of_bytes(b"request")).await? else { unreachable!() };
//! let mut writer = lease.chunk_writer();
//! for part in [&b"first "[..], b"second"] {
//!     writer.write(part).await?;
//! }
//! lease.complete_chunked(&writer, &writer.manifest().encode()).await?;
//!
//! let Begin::Replay(replay) = idem.begin("k", Fingerprint::of_bytes(b"request")).await? else { unreachable!() };
//! let manifest = Manifest::decode(replay.payload()).expect("a manifest");
//! let mut chunks = Chunks::new(idem.store().clone(), lease.key().as_str(), manifest);
//! let mut read = Vec::new();
//! while let Some(chunk) = chunks.next().await {
//!     read.extend(chunk.expect("a chunk"));
//! }
//! assert_eq!(read, b"first second");
//! # Ok(())
//! # }
//! ```
//!
//! # Decisions
//!
//! * **A chunk is a record of its own**, inserted `Completed` under a key
//!   derived from the outcome's key, the writer's token and the chunk's
//!   index ([`chunk_key`]). Every store, one of a user's own included, keeps
//!   chunks with the primitives the conformance kit proves on it, and a
//!   chunk costs one insert: one atomic step on one key, one round trip.
//!   Derived keys begin with `~`, which no record key does (their storage
//!   form begins with a digit), so they never meet a record's key.
//! * **Fenced by the completion.** A chunk's key names its writer's token,
//!   and only the owner's completion, a compare-and-set on that token,
//!   names which chunks make the outcome. Chunks written by a stale owner
//!   (one whose key was taken over) are never read: no manifest names its
//!   token.
//! * **Never replayed truncated.** The record names its chunks only once
//!   the last is written. An owner that dies mid-stream leaves its record
//!   in flight: the lease lapses, a retry takes the key over and runs the
//!   work again under a new token, and the dead owner's chunks lapse with
//!   their retention unread. A reader checks each chunk's index, the count
//!   and the total length, and says which chunk is missing
//!   ([`ChunkError`]) rather than yield a short outcome.
//! * **Chunks outlive their record.** A chunk is kept for the retention
//!   plus one lease from its write; the outcome's record is completed with
//!   the retention less the time since the first chunk was written. The
//!   record therefore lapses before the first of its chunks does, and a
//!   replay never finds a record whose chunks are gone. Deleting a record
//!   ([`Store::reset`]) leaves its chunks to
//!   lapse: without a manifest they are never read.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{Insert, NewRecord, State, Store, StoreError, Token};
use crate::{Error, Fingerprint, Lease, When};

/// The size of chunk the HTTP layer writes: 64 KiB, a tenth of a
/// millisecond on a local store and far below every store's value limit.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// The key a chunk is kept under: `~{key}~{token}~{index}`, the token in
/// 32 hex digits and the index in 10 decimal digits. The suffix has a fixed
/// width, so distinct keys, tokens and indexes give distinct chunk keys.
pub fn chunk_key(key: &str, token: Token, index: u32) -> String {
    format!("~{key}~{token}~{index:010}")
}

/// The index of an outcome's head ([`ChunkWriter::write_head`]), which no
/// chunk has: a count fits in a `u32`, so the last chunk's index is below
/// it.
pub const HEAD: u32 = u32::MAX;

/// Which chunks make an outcome: its writer's token, how many chunks and
/// how many bytes in all. A payload that completes a chunked outcome
/// carries it ([`Manifest::encode`]); its layout is fixed: the 16 token
/// bytes, the count in 4 bytes and the length in 8, big-endian.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    token: Token,
    count: u32,
    len: u64,
}

impl Manifest {
    /// The bytes [`encode`](Manifest::encode) writes.
    pub const ENCODED_LEN: usize = 28;

    /// The token the chunks were written under.
    pub fn token(&self) -> Token {
        self.token
    }

    /// How many chunks make the outcome.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The outcome's length in bytes, all chunks together.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the outcome is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The manifest's fixed 28 bytes.
    pub fn encode(&self) -> [u8; Manifest::ENCODED_LEN] {
        let mut out = [0; Manifest::ENCODED_LEN];
        out[..16].copy_from_slice(self.token.as_bytes());
        out[16..20].copy_from_slice(&self.count.to_be_bytes());
        out[20..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Reads the bytes [`encode`](Manifest::encode) wrote; `None` for
    /// anything else.
    pub fn decode(bytes: &[u8]) -> Option<Manifest> {
        let bytes: &[u8; Manifest::ENCODED_LEN] = bytes.try_into().ok()?;
        let token = Token::try_from(&bytes[..16]).ok()?;
        let count = u32::from_be_bytes(bytes[16..20].try_into().ok()?);
        let len = u64::from_be_bytes(bytes[20..].try_into().ok()?);
        Some(Manifest { token, count, len })
    }
}

impl fmt::Debug for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manifest")
            .field("token", &self.token)
            .field("count", &self.count)
            .field("len", &self.len)
            .finish()
    }
}

/// Writes an owner's chunks, one insert each; see the [module](self).
pub struct ChunkWriter {
    store: Arc<dyn Store>,
    key: String,
    token: Token,
    fingerprint: Fingerprint,
    chunk_retention: Duration,
    first: Option<Instant>,
    count: u32,
    len: u64,
}

impl fmt::Debug for ChunkWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkWriter")
            .field("key", &self.key)
            .field("count", &self.count)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl ChunkWriter {
    /// Writes `chunk` as the next chunk. On a store error nothing is
    /// counted and the same chunk may be written again: a write that landed
    /// is found and accepted.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let Some(count) = self.count.checked_add(1) else {
            return Err(Error::store(
                StoreError::config("idem-core", "an outcome holds at most 2^32 - 1 chunks"),
                When::AfterWork,
            ));
        };
        // Taken before the first write is sent, so that the record's
        // retention, counted from here, ends before the chunk's.
        let first = self.first.unwrap_or_else(Instant::now);
        self.insert(self.count, chunk).await?;
        self.first = Some(first);
        self.count = count;
        self.len += chunk.len() as u64;
        Ok(())
    }

    /// Writes `head`, what a follower needs before the first chunk (the
    /// HTTP layer's status and headers), under the index [`HEAD`]; it is
    /// not counted among the chunks. A reader of an outcome still in
    /// flight finds it with [`read_chunk`] under the owner's token, then
    /// follows the chunks as they are written.
    pub async fn write_head(&mut self, head: &[u8]) -> Result<(), Error> {
        let first = self.first.unwrap_or_else(Instant::now);
        self.insert(HEAD, head).await?;
        self.first = Some(first);
        Ok(())
    }

    async fn insert(&self, index: u32, chunk: &[u8]) -> Result<(), Error> {
        let key = chunk_key(&self.key, self.token, index);
        let record = NewRecord {
            token: self.token,
            fingerprint: self.fingerprint,
            state: State::Completed,
            payload: chunk,
            lease: None,
            retention: self.chunk_retention,
        };
        match (*self.store).insert(&key, &record).await {
            Ok(Insert::Inserted) => Ok(()),
            Ok(Insert::Found(found))
                if found.token == self.token && found.payload.as_slice() == chunk =>
            {
                Ok(())
            }
            Ok(Insert::Found(_)) => Err(Error::store(
                StoreError::corrupt(
                    "idem-core",
                    format!("another chunk is already kept under {key:?}"),
                ),
                When::AfterWork,
            )),
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    /// What has been written so far.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            token: self.token,
            count: self.count,
            len: self.len,
        }
    }

    /// The retention the outcome's record gets when it is completed now:
    /// the lease's retention less the time since the first chunk, so that
    /// the record lapses before its chunks (never below a millisecond).
    fn final_retention(&self, retention: Duration) -> Duration {
        let spent = self.first.map_or(Duration::ZERO, |first| first.elapsed());
        retention
            .saturating_sub(spent)
            .max(Duration::from_millis(1))
    }
}

impl Lease {
    /// A writer for this owner's chunks (see [`chunks`](crate::chunks)).
    pub fn chunk_writer(&self) -> ChunkWriter {
        ChunkWriter {
            store: self.store_arc().clone(),
            key: self.key().as_str().to_owned(),
            token: self.token(),
            fingerprint: self.fingerprint(),
            chunk_retention: self.retention().saturating_add(self.lease_length()),
            first: None,
            count: 0,
            len: 0,
        }
    }

    /// Records an outcome written in chunks as `Completed`: `payload` is the
    /// caller's encoding, which carries `writer`'s
    /// [`manifest`](ChunkWriter::manifest). The record's retention is
    /// shortened by the time since the first chunk, so that it lapses
    /// before its chunks do. Fenced like [`complete`](Lease::complete).
    pub async fn complete_chunked(
        &self,
        writer: &ChunkWriter,
        payload: &[u8],
    ) -> Result<(), Error> {
        let record = NewRecord {
            retention: writer.final_retention(self.retention()),
            ..self.record(State::Completed, payload)
        };
        self.swap_record(&record).await
    }
}

/// Why a chunked outcome could not be read whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// The store failed reading chunk `index`.
    #[error("the store failed reading chunk {index}: {source}")]
    Store {
        /// The chunk's index.
        index: u32,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Chunk `index` is not in the store: it lapsed or was evicted.
    #[error("chunk {index} of the recorded outcome is missing")]
    Missing {
        /// The chunk's index.
        index: u32,
    },
    /// Chunk `index` is not the chunk the manifest names, or the chunks do
    /// not add up to the manifest's length.
    #[error("chunk {index} of the recorded outcome is damaged: {reason}")]
    Damaged {
        /// The chunk's index.
        index: u32,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Reads chunk `index` (or the [`HEAD`]) written under `token` for the
/// outcome under `key`: `None` when it is not there (not written yet, or
/// lapsed). For a follower of an outcome still in flight; a replay reads
/// with [`Chunks`].
pub async fn read_chunk(
    store: &dyn Store,
    key: &str,
    token: Token,
    index: u32,
) -> Result<Option<Vec<u8>>, ChunkError> {
    let chunk = chunk_key(key, token, index);
    let record = match store.load(&chunk).await {
        Ok(Some(record)) => record,
        Ok(None) => return Ok(None),
        Err(source) => return Err(ChunkError::Store { index, source }),
    };
    if record.token != token || record.state != State::Completed {
        return Err(ChunkError::Damaged {
            index,
            reason: "it was not written by the owner that recorded the outcome",
        });
    }
    Ok(Some(record.payload))
}

/// How many times a chunk's read is made before a store error ends the
/// read: a replay cut short by one blip would cost its client the whole
/// response.
const READ_ATTEMPTS: u32 = 3;

/// [`read_chunk`], tried again after a store error (20 ms, then 40 ms
/// later).
pub async fn read_retried(
    store: &dyn Store,
    key: &str,
    token: Token,
    index: u32,
) -> Result<Option<Vec<u8>>, ChunkError> {
    let mut attempt = 1;
    loop {
        match read_chunk(store, key, token, index).await {
            Err(ChunkError::Store { source, .. }) if attempt < READ_ATTEMPTS => {
                tracing::warn!(index, error = %source, "reading a chunk failed; trying again");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                attempt += 1;
            }
            read => return read,
        }
    }
}

/// Reads a chunked outcome's chunks in order, one store read each.
#[derive(Debug)]
pub struct Chunks {
    store: Arc<dyn Store>,
    key: String,
    manifest: Manifest,
    next: u32,
    read: u64,
    failed: bool,
}

impl Chunks {
    /// Reads the chunks `manifest` names of the outcome under `key` (the
    /// storage form, [`Key::as_str`](crate::Key::as_str)).
    pub fn new(store: Arc<dyn Store>, key: &str, manifest: Manifest) -> Chunks {
        Chunks {
            store,
            key: key.to_owned(),
            manifest,
            next: 0,
            read: 0,
            failed: false,
        }
    }

    /// The manifest being read.
    pub fn manifest(&self) -> Manifest {
        self.manifest
    }

    /// The next chunk, or `None` after the last one; after an error,
    /// `None`.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, ChunkError>> {
        if self.failed || self.next >= self.manifest.count {
            return None;
        }
        let index = self.next;
        let read = self.read_one(index).await;
        match &read {
            Ok(chunk) => {
                self.next += 1;
                self.read += chunk.len() as u64;
            }
            Err(_) => self.failed = true,
        }
        Some(read)
    }

    async fn read_one(&self, index: u32) -> Result<Vec<u8>, ChunkError> {
        let token = self.manifest.token;
        let Some(payload) = read_retried(&*self.store, &self.key, token, index).await? else {
            return Err(ChunkError::Missing { index });
        };
        let read = self.read + payload.len() as u64;
        let last = index + 1 == self.manifest.count;
        if read > self.manifest.len || (last && read != self.manifest.len) {
            return Err(ChunkError::Damaged {
                index,
                reason: "the chunks do not add up to the recorded length",
            });
        }
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Begin, Idempotent, MemoryStore};

    #[test]
    fn manifests_read_back_or_not_at_all() {
        let manifest = Manifest {
            token: Token::random(),
            count: 7,
            len: 1 << 40,
        };
        assert_eq!(Manifest::decode(&manifest.encode()), Some(manifest));
        assert_eq!(Manifest::decode(&manifest.encode()[..27]), None);
        assert_eq!(Manifest::decode(&[0; 29]), None);
    }

    #[test]
    fn chunk_keys_never_meet_record_keys() {
        let token = Token::random();
        let key = chunk_key("2:ns0:k", token, 3);
        assert_eq!(key, format!("~2:ns0:k~{token}~0000000003"));
        assert_ne!(chunk_key("a~", token, 1), chunk_key("a", token, 1));
    }

    #[tokio::test]
    async fn a_missing_chunk_is_named_not_skipped() {
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotent::from_arc(store.clone());
        let Ok(Begin::Run(lease)) = idem.begin("k", Fingerprint::of_bytes(b"r")).await else {
            panic!("the first call runs");
        };
        let mut writer = lease.chunk_writer();
        for part in [&b"ab"[..], b"cd", b"ef"] {
            writer.write(part).await.unwrap();
        }
        let manifest = writer.manifest();
        let key = lease.key().as_str().to_owned();
        let gone = chunk_key(&key, manifest.token(), 1);
        let found = store.load(&gone).await.unwrap().unwrap();
        assert!(store.reset(&gone).await.is_ok(), "{found:?}");
        let mut chunks = Chunks::new(store, &key, manifest);
        assert_eq!(chunks.next().await.unwrap().unwrap(), b"ab");
        assert!(matches!(
            chunks.next().await,
            Some(Err(ChunkError::Missing { index: 1 }))
        ));
        assert!(chunks.next().await.is_none(), "nothing after an error");
    }

    #[tokio::test]
    async fn a_manifest_longer_than_its_chunks_is_damage() {
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotent::from_arc(store.clone());
        let Ok(Begin::Run(lease)) = idem.begin("k", Fingerprint::of_bytes(b"r")).await else {
            panic!("the first call runs");
        };
        let mut writer = lease.chunk_writer();
        writer.write(b"abc").await.unwrap();
        let lying = Manifest {
            len: 4,
            ..writer.manifest()
        };
        let mut chunks = Chunks::new(store, lease.key().as_str(), lying);
        assert!(matches!(
            chunks.next().await,
            Some(Err(ChunkError::Damaged { index: 0, .. }))
        ));
    }
}
