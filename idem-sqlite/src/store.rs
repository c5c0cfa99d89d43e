//! `SqliteStore`: the handle async callers hold, and its options.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, Store, StoreError, Token, Wakeups};
use tokio::sync::oneshot;

use crate::error::Failure;
use crate::ops::{Done, Op};
use crate::schema::Target;
use crate::writer::{self, Command, Job, Setting, Settings};

/// How long a busy database is waited for before an operation fails.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many waiting operations share one transaction at most.
pub const DEFAULT_MAX_BATCH: usize = 128;

/// The writer connection's page cache, in bytes, unless
/// [`SqliteStore::with_cache_size`] says otherwise: 64 MiB.
///
/// SQLite's own default is 2 MB, which holds a 10,000-record file whole but
/// only a sliver of a large one: at millions of records every lookup then
/// reads the B-trees' inner pages back from the kernel, one system call a
/// page, and replays slow down as the file grows. 64 MiB keeps the inner
/// pages of both B-trees (the key's and the table's) of a file of ten
/// million records in the cache, so a lookup reads at most its two leaf
/// pages. The cache fills only as pages are read: a small file uses no more
/// than its size.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// When SQLite flushes a commit to the disk (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is flushed (fsync of the write-ahead log) before the
    /// operation answers: a recorded outcome survives a power cut or an OS
    /// crash. The default.
    #[default]
    Full,
    /// Commits reach the OS at once but the disk only at checkpoints: a
    /// recorded outcome survives the process being killed, but the last
    /// commits before a power cut or an OS crash may be lost (the file stays
    /// consistent), and their work may then run again. Much faster for a
    /// lone caller, whose every commit would otherwise wait for the disk.
    Normal,
}

/// A [`Store`] in a SQLite file, for idem with nothing to install.
///
/// # How it works
///
/// * **One writer.** A single connection, on its own OS thread, runs every
///   operation; callers send it their operation over a channel and await
///   the answer, so the async runtime never blocks on SQLite. Each method
///   costs one trip to that thread.
/// * **Group commit.** The operations that queued up while the thread was
///   busy run together in one transaction, one after another, and are
///   answered after its commit. Each sees exactly what it would have seen
///   alone; a lone caller never waits for company; and a crowd of callers
///   pays for one flush to disk instead of one each. An operation whose
///   statement fails gets its error while the rest run again without it.
/// * **Reads go through the writer too.** [`Store::load`] is rare on the
///   protocol's paths (a replay is answered by `insert` itself), so a
///   second connection would buy little; through the writer every read
///   sees every answered write, and an in-memory database works unchanged.
///   A batch of reads alone takes no write lock.
/// * **Cache.** That connection keeps up to [`DEFAULT_CACHE_BYTES`] (64 MiB)
///   of pages ([`with_cache_size`](SqliteStore::with_cache_size)), so that
///   a lookup in a file of millions of records finds the B-trees' inner
///   pages in memory instead of reading them back from the kernel.
///   Memory-mapped I/O is off, as SQLite ships it (an I/O error on a
///   mapped page ends the process instead of failing a statement);
///   [`with_mmap_size`](SqliteStore::with_mmap_size) turns it on for files
///   much larger than the cache.
/// * **Durability.** The file is in WAL mode with
///   [`Synchronous::Full`] by default: an outcome that an operation
///   reported as recorded is on disk, so it survives a power cut, not just
///   a crash of the process. Group commit is what makes that affordable
///   under load: a crowd of callers shares each flush. With
///   [`Synchronous::Normal`] a commit reaches the OS but is flushed only at
///   checkpoints: much faster for a lone caller, and still safe when the
///   process is killed, but a power cut or OS crash may lose the last
///   records, and then their work may run a second time. Choose it only
///   where that is acceptable.
/// * **Time.** Deadlines are computed inside the store from this machine's
///   clock (unix microseconds, so they survive a restart) and reported as
///   time remaining; callers' clocks are never used. Processes sharing a
///   file run on one machine (SQLite's file locks require it), so they read
///   one clock.
/// * **Busy files.** Another process holding the write lock is waited for
///   up to the [busy timeout](SqliteStore::with_busy_timeout); then the
///   operation fails with a [`StoreError`] saying so, and the store works
///   again once the lock is free. Several processes may share a file;
///   SQLite's lock takes their writes in turn.
/// * **Purging.** [`Store::purge_expired`] deletes at most `limit` records,
///   found through an index on the retention deadline, in chunks of
///   [`PURGE_CHUNK`], each one statement on the writer thread: the
///   operations sent meanwhile are served between chunks, so a purge of
///   [`PURGE_BATCH`](idem_core::store::PURGE_BATCH) records holds a claim up for
///   one chunk's delete, not the whole batch's. The price: each chunk
///   commits on its own, so a purge deletes fewer records a second
///   (still 15× a 1,000/s ingest at ten million records,
///   `dev/idem-bench/notes/2026-12-01-purge-at-scale.md`).
///
/// # Schema
///
/// One STRICT table, `idem_records`: `key TEXT PRIMARY KEY` (the encoded
/// key), `token BLOB`, `fingerprint BLOB`, `state INTEGER`, `payload BLOB`,
/// `lease_until INTEGER` and `retain_until INTEGER` (unix microseconds),
/// with an index on `retain_until` for [`Store::purge_expired`]. A file
/// holding another table of that name, or that is not a SQLite database, is
/// refused with a [config](idem_core::store::StoreErrorKind::Config) error; a row
/// that does not decode is a [corrupt](idem_core::store::StoreErrorKind::Corrupt)
/// error.
///
/// Cheap to clone: clones share the writer thread, which ends when the
/// last clone is dropped.
///
/// Waiters ([`Idempotent::with_wait`](idem_core::Idempotent::with_wait))
/// are woken in process ([`Store::wakeups`]) once a completion, failure or
/// release has committed — through this store or any clone of it. The
/// writer thread wakes them itself right after the commit, before it
/// answers the owner, so a waiter does not wait for the owner's task to be
/// scheduled first. Another
/// process writing the same file sends no wake-ups: waiters on its keys
/// find the outcome by polling.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) commands: Sender<Command>,
    path: Option<PathBuf>,
    pub(crate) wakeups: Arc<Wakeups>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The most records one purge statement deletes; see "Purging" on
/// [`SqliteStore`].
pub const PURGE_CHUNK: usize = 100;

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and its
    /// schema, in WAL mode.
    ///
    /// Opening waits up to [`DEFAULT_BUSY_TIMEOUT`] for a database that
    /// another process holds locked.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        SqliteStore::start(Target::File(path.clone()), Some(path)).await
    }

    /// A private database in memory: fast, and gone with the store.
    pub async fn open_in_memory() -> Result<SqliteStore, StoreError> {
        SqliteStore::start(Target::Memory, None).await
    }

    async fn start(target: Target, path: Option<PathBuf>) -> Result<SqliteStore, StoreError> {
        let settings = Settings {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            synchronous: Synchronous::default(),
            cache_bytes: DEFAULT_CACHE_BYTES,
        };
        let wakeups = Arc::new(Wakeups::new());
        let commands = writer::start(target, settings, Arc::clone(&wakeups))
            .await
            .map_err(Failure::into_store_error)?;
        Ok(SqliteStore {
            commands,
            path,
            wakeups,
        })
    }

    /// Sets how long an operation waits for a database that another
    /// connection holds locked before it fails (default
    /// [`DEFAULT_BUSY_TIMEOUT`]). Operations queued behind a waiting one wait
    /// too, so a caller may wait up to about twice this.
    pub fn with_busy_timeout(self, timeout: Duration) -> SqliteStore {
        self.configure(Setting::BusyTimeout(timeout))
    }

    /// Sets how many waiting operations may share one transaction (default
    /// [`DEFAULT_MAX_BATCH`]); `1` (or `0`) turns group commit off.
    pub fn with_max_batch(self, operations: usize) -> SqliteStore {
        self.configure(Setting::MaxBatch(operations))
    }

    /// Sets when commits are flushed to disk (default
    /// [`Synchronous::Full`]).
    pub fn with_synchronous(self, synchronous: Synchronous) -> SqliteStore {
        self.configure(Setting::Synchronous(synchronous))
    }

    /// Sets the writer connection's page cache in bytes (default
    /// [`DEFAULT_CACHE_BYTES`]; `PRAGMA cache_size`). Every operation runs
    /// on that one connection, so this is the store's whole cache; the
    /// kernel's page cache sits behind it.
    pub fn with_cache_size(self, bytes: usize) -> SqliteStore {
        self.configure(Setting::CacheSize(bytes))
    }

    /// Lets SQLite read up to `bytes` of the file through memory-mapped
    /// I/O (`PRAGMA mmap_size`; default 0, off, as SQLite ships it; SQLite
    /// caps it at about 2 GB on Linux).
    ///
    /// A lookup then reads its pages from the kernel's page cache directly,
    /// without a system call and a copy into the page cache above: in a
    /// file far larger than that cache it is the difference between
    /// replays that slow down with the file's size and replays that do not
    /// (`dev/idem-bench/notes/2026-11-30-scale.md`). What it costs: an I/O error on a
    /// mapped page (a failing disk, a file truncated behind SQLite's back)
    /// ends the process with `SIGBUS` instead of failing one statement,
    /// and the mapped pages count toward the process's resident memory.
    pub fn with_mmap_size(self, bytes: u64) -> SqliteStore {
        self.configure(Setting::MmapSize(bytes))
    }

    fn configure(self, setting: Setting) -> SqliteStore {
        // The channel keeps order, so the setting applies to every operation
        // sent after it. Should the thread be gone, the next operation says
        // so.
        let _ = self.commands.send(Command::Configure(setting));
        self
    }

    /// Creates the table and index unless they exist, and checks that an
    /// existing table is the store's. [`open`](SqliteStore::open) already
    /// does this; calling it again is harmless.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Migrate(reply))?;
        answer
            .await
            .unwrap_or(Err(Failure::WriterGone))
            .map_err(Failure::into_store_error)
    }

    /// The database file, or `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn send(&self, command: Command) -> Result<(), StoreError> {
        self.commands
            .send(command)
            .map_err(|_| Failure::WriterGone.into_store_error())
    }

    /// Runs `op` on the writer thread and awaits its answer.
    pub(crate) async fn call(&self, op: Op) -> Result<Done, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Job(Job { op, reply }))?;
        answer
            .await
            .unwrap_or(Err(Failure::WriterGone))
            .map_err(Failure::into_store_error)
    }
}

/// An answer of the wrong shape: a bug in this crate, reported rather than
/// panicked on.
pub(crate) fn unexpected(done: Done) -> StoreError {
    StoreError::backend(
        crate::error::BACKEND,
        format!("the writer thread gave an answer of the wrong kind: {done:?}"),
    )
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let op = Op::Insert {
            key: key.to_owned(),
            record: record.into(),
        };
        match self.call(op).await? {
            Done::Insert(insert) => Ok(insert),
            other => Err(unexpected(other)),
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.replace(key, expected, record, false).await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.replace(key, expected, record, true).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let op = Op::Remove {
            key: key.to_owned(),
            expected,
        };
        match self.call(op).await? {
            // The writer thread has woken the key's waiters at commit.
            Done::Changed(removed) => Ok(removed),
            other => Err(unexpected(other)),
        }
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        match self
            .call(Op::Load {
                key: key.to_owned(),
            })
            .await?
        {
            Done::Loaded(record) => Ok(record),
            other => Err(unexpected(other)),
        }
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        match self
            .call(Op::Reset {
                key: key.to_owned(),
            })
            .await?
        {
            Done::Reset(reset) => Ok(reset),
            other => Err(unexpected(other)),
        }
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // In chunks, each its own operation on the writer thread, so that
        // the claims and replays sent meanwhile are served between them
        // rather than after the whole batch.
        let mut purged = 0;
        while purged < limit {
            let chunk = (limit - purged).min(PURGE_CHUNK);
            match self.call(Op::Purge { limit: chunk }).await? {
                Done::Purged(n) => {
                    purged += n;
                    if n < chunk {
                        break;
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(purged)
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        Some(Arc::clone(&self.wakeups))
    }
}

impl SqliteStore {
    async fn replace(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
        take_over: bool,
    ) -> Result<bool, StoreError> {
        let op = Op::Swap {
            key: key.to_owned(),
            expected,
            record: record.into(),
            take_over,
        };
        match self.call(op).await? {
            // The writer thread has woken the key's waiters at commit.
            Done::Changed(changed) => Ok(changed),
            other => Err(unexpected(other)),
        }
    }
}
