//! The writer thread: one connection, fed by a channel, that groups the
//! operations waiting for it into one transaction (group commit).

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use idem_core::store::Wakeups;
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::Failure;
use crate::ops::{Done, Op, OpError};
use crate::schema::{self, Target};
use crate::Synchronous;

/// An operation and where its answer goes.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Done, Failure>>,
}

/// What the writer thread is asked to do, in the order it is asked.
#[derive(Debug)]
pub(crate) enum Command {
    Job(Job),
    Migrate(oneshot::Sender<Result<(), Failure>>),
    Configure(Setting),
}

/// A setting changed after opening; it applies to every later command.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Setting {
    BusyTimeout(Duration),
    MaxBatch(usize),
    Synchronous(Synchronous),
    CacheSize(usize),
    MmapSize(u64),
}

/// The writer's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) busy_timeout: Duration,
    pub(crate) max_batch: usize,
    pub(crate) synchronous: Synchronous,
    pub(crate) cache_bytes: usize,
}

/// Starts the writer thread on `target` and returns its channel once the
/// connection is open and the schema in place; on failure the thread has
/// already ended.
pub(crate) async fn start(
    target: Target,
    settings: Settings,
    wakeups: Arc<Wakeups>,
) -> Result<Sender<Command>, Failure> {
    let (commands, inbox) = mpsc::channel();
    let (ready, opened) = oneshot::channel();
    thread::Builder::new()
        .name("idem-sqlite-writer".to_owned())
        .spawn(move || {
            let started = schema::connect(&target, &settings).and_then(|conn| {
                schema::migrate(&conn, settings.busy_timeout)?;
                Ok(conn)
            });
            match started {
                Ok(conn) => {
                    // An opener that stopped waiting has dropped its store,
                    // and with it the channel: the loop ends at once.
                    let _ = ready.send(Ok(()));
                    Writer::new(conn, settings, wakeups).run(&inbox);
                }
                Err(failure) => {
                    let _ = ready.send(Err(failure));
                }
            }
        })
        .map_err(|error| Failure::Spawn(Arc::new(error)))?;
    opened.await.unwrap_or(Err(Failure::WriterGone))?;
    Ok(commands)
}

pub(crate) struct Writer {
    conn: Connection,
    settings: Settings,
    /// A setting SQLite refused: the store no longer runs as configured, so
    /// every later operation fails with it rather than silently going on.
    broken: Option<Failure>,
    /// The store's waiters, woken as soon as a commit records an outcome.
    wakeups: Arc<Wakeups>,
}

impl Writer {
    pub(crate) fn new(conn: Connection, settings: Settings, wakeups: Arc<Wakeups>) -> Writer {
        Writer {
            conn,
            settings,
            broken: None,
            wakeups,
        }
    }

    /// Serves commands until every sender is gone.
    ///
    /// Group commit without a timer: whatever queued up while the previous
    /// transaction committed forms the next batch, so a lone caller never
    /// waits for company and a crowd shares one commit (one fsync).
    fn run(mut self, inbox: &Receiver<Command>) {
        let mut carried = None;
        loop {
            let command = match carried.take() {
                Some(command) => command,
                None => match inbox.recv() {
                    Ok(command) => command,
                    Err(mpsc::RecvError) => return,
                },
            };
            match command {
                Command::Job(job) => {
                    let mut jobs = vec![job];
                    // A transactional work or session ends its batch: it
                    // runs once, so no job after it may fail and make the
                    // batch run again.
                    while jobs.len() < self.settings.max_batch
                        && !matches!(
                            jobs.last(),
                            Some(Job {
                                op: Op::Work(_) | Op::Session(_),
                                ..
                            })
                        )
                    {
                        match inbox.try_recv() {
                            Ok(Command::Job(job)) => jobs.push(job),
                            // A setting or migration applies after the jobs
                            // sent before it, never to them.
                            Ok(other) => {
                                carried = Some(other);
                                break;
                            }
                            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                        }
                    }
                    self.execute(jobs);
                }
                Command::Migrate(reply) => {
                    let _ = reply.send(schema::migrate(&self.conn, self.settings.busy_timeout));
                }
                Command::Configure(setting) => self.configure(setting),
            }
        }
    }

    fn configure(&mut self, setting: Setting) {
        match setting {
            Setting::BusyTimeout(timeout) => {
                self.settings.busy_timeout = timeout;
                if let Err(error) = self.conn.busy_timeout(timeout) {
                    self.broken = Some(Failure::Setting {
                        what: format!("busy timeout {timeout:?}"),
                        source: Some(Arc::new(error)),
                    });
                }
            }
            Setting::MaxBatch(max) => self.settings.max_batch = max.max(1),
            Setting::Synchronous(synchronous) => {
                self.settings.synchronous = synchronous;
                if let Err(failure) = schema::set_synchronous(&self.conn, synchronous) {
                    self.broken = Some(failure);
                }
            }
            Setting::MmapSize(bytes) => {
                if let Err(failure) = schema::set_mmap_size(&self.conn, bytes) {
                    self.broken = Some(failure);
                }
            }
            Setting::CacheSize(bytes) => {
                self.settings.cache_bytes = bytes;
                if let Err(failure) = schema::set_cache_size(&self.conn, bytes) {
                    self.broken = Some(failure);
                }
            }
        }
    }

    /// Runs `jobs` in one transaction and answers each after the commit,
    /// waking the waiters of every key it settled.
    ///
    /// Each job sees the effects of the jobs before it, exactly as if they
    /// had run one by one. A job whose statement fails is answered with its
    /// error and dropped, and the others run again without it in a fresh
    /// transaction, so one bad job never spoils another's answer. A failure
    /// of the transaction itself (`BEGIN`, `COMMIT`) is every job's answer.
    pub(crate) fn execute(&mut self, mut jobs: Vec<Job>) {
        if let Some(broken) = &self.broken {
            for job in jobs {
                let _ = job.reply.send(Err(broken.clone()));
            }
            return;
        }
        // A claim or read whose caller stopped waiting (a dropped future)
        // is skipped: nobody would learn it succeeded, so a claim would
        // only block its key until the lease lapsed. Writes that settle a
        // key still run: their work may have happened.
        jobs.retain(|job| !(job.op.is_skippable() && job.reply.is_closed()));
        while !jobs.is_empty() {
            // Reads alone take no write lock, so they go on while another
            // process holds the database busy.
            let begin = if jobs.iter().all(|job| job.op.is_read()) {
                "BEGIN"
            } else {
                "BEGIN IMMEDIATE"
            };
            if let Err(error) = self.statement(begin) {
                return self.fail_all(jobs, error);
            }
            let mut answers = Vec::with_capacity(jobs.len());
            let mut failed = None;
            for (at, job) in jobs.iter().enumerate() {
                match job.op.run(&self.conn) {
                    Ok(done) => answers.push(Ok(done)),
                    Err(OpError::Bad(failure)) => answers.push(Err(failure)),
                    Err(OpError::Statement(error)) => {
                        failed = Some((at, error));
                        break;
                    }
                }
            }
            if let Some((at, error)) = failed {
                // SQLite may have undone the whole transaction or only the
                // statement; rolling back ourselves leaves one known state.
                self.rollback();
                if is_lock(&error) {
                    // Another connection's lock, waited for in vain, would
                    // be waited for again by every job that follows.
                    return self.fail_all(jobs, error);
                }
                let job = jobs.remove(at);
                let _ = job.reply.send(Err(self.failure(error)));
                continue;
            }
            if let Err(error) = self.statement("COMMIT") {
                self.rollback();
                return self.fail_all(jobs, error);
            }
            for (job, answer) in jobs.into_iter().zip(answers) {
                // Committed: wake the key's waiters now, from this thread,
                // rather than after the owner's task is scheduled to read
                // its answer.
                if let (Ok(Done::Changed(true)), Some(key)) = (&answer, job.op.wakes()) {
                    self.wakeups.wake(key);
                }
                let _ = job.reply.send(answer);
            }
            return;
        }
    }

    fn fail_all(&self, jobs: Vec<Job>, error: rusqlite::Error) {
        let failure = self.failure(error);
        for job in jobs {
            let _ = job.reply.send(Err(failure.clone()));
        }
    }

    fn failure(&self, error: rusqlite::Error) -> Failure {
        Failure::from_sqlite(error, self.settings.busy_timeout)
    }

    fn rollback(&self) {
        if !self.conn.is_autocommit() {
            // If even this fails, the next BEGIN fails and says why.
            let _ = self.statement("ROLLBACK");
        }
    }

    /// Runs a statement without parameters from the statement cache: the
    /// transaction statements run for every batch, so parsing them each
    /// time would show.
    fn statement(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(drop)
    }
}

fn is_lock(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

#[cfg(test)]
mod tests;
