//! Group commit: one writer thread owns the write connection of a process, and every
//! write of the store queues to it.
//!
//! The writer takes the first queued write, then every other one already waiting (up
//! to a batch), and runs them in order inside one `BEGIN IMMEDIATE` transaction, each
//! in a savepoint of its own: a write that fails is rolled back alone and answered with
//! its error, the others go on. Then one `COMMIT` (one fsync, `synchronous = FULL`)
//! makes the whole batch durable, and only then is each caller answered. So:
//!
//! - every write is exactly what it was as a transaction of its own: the writes of a
//!   batch run one after another, each seeing the ones before it, and a write that
//!   checks a lease or a version does so inside the transaction that commits it;
//! - an acknowledged write is durable: no caller hears `Ok` before the commit;
//! - the cost of an fsync is shared by every write waiting for it, and writers of one
//!   process no longer compete for SQLite's write lock through its sleep-and-retry
//!   busy handler: they queue, first come first served.
//!
//! The queue is bounded: when it is full, a write fails at once with
//! [`StoreError::Busy`] (the http adapter answers 503 with `Retry-After`) instead of
//! waiting out a busy timeout.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::{Context, classify};
use crate::store::StoreError;

/// Writes waiting for the writer, at most. Beyond this the store is overloaded and
/// refuses at once.
pub(super) const QUEUE: usize = 4096;
/// Writes per transaction, at most: a bound on how long one commit holds the lock.
const BATCH: usize = 256;

/// One queued write: runs on the writer's connection inside the batch transaction,
/// or fails without running when the transaction could not start.
trait Job: Send {
    /// Run inside the batch transaction; returns how to answer its caller once the
    /// batch is committed (or failed).
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Answer>;

    /// The batch could not start: answer with `error`, the write never ran.
    fn fail(self: Box<Self>, error: StoreError);
}

/// How a write that ran is answered, once its batch's fate is known.
trait Answer: Send {
    fn give(self: Box<Self>, committed: Result<(), StoreError>);
}

/// A write and its caller.
struct Write<T, F> {
    context: &'static str,
    write: F,
    answer: oneshot::Sender<Result<T, StoreError>>,
}

/// A write that ran, with what it produced.
struct Ran<T> {
    outcome: Result<T, StoreError>,
    answer: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Write<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Answer> {
        let outcome = in_savepoint(conn, self.context, self.write);
        Box::new(Ran {
            outcome,
            answer: self.answer,
        })
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.answer.send(Err(error));
    }
}

impl<T: Send + 'static> Answer for Ran<T> {
    fn give(self: Box<Self>, committed: Result<(), StoreError>) {
        // A write that failed was rolled back alone: its own error. A write that
        // succeeded is as durable as the commit of its batch.
        let result = match (self.outcome, committed) {
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            (Ok(value), Ok(())) => Ok(value),
        };
        let _ = self.answer.send(result);
    }
}

/// The handle to a process's writer thread; cloned by every user of the store. The
/// thread ends when the last handle is dropped.
#[derive(Clone)]
pub(super) struct Writer {
    jobs: SyncSender<Box<dyn Job>>,
}

impl Writer {
    /// Start the writer thread on `conn`, which must be a connection of its own.
    pub(super) fn start(conn: Connection) -> std::io::Result<Writer> {
        let (jobs, queue) = sync_channel::<Box<dyn Job>>(QUEUE);
        std::thread::Builder::new()
            .name("lull-sqlite-writer".into())
            .spawn(move || serve(conn, queue))?;
        Ok(Writer { jobs })
    }

    /// Run `write` in the next batch; its result once the batch is durable.
    pub(super) async fn write<T, F>(&self, context: &'static str, write: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job = Box::new(Write {
            context,
            write,
            answer,
        });
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(StoreError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                return Err(StoreError::Pool("the database writer stopped".into()));
            }
        }
        answered
            .await
            .map_err(|_| StoreError::Pool("the database writer stopped".into()))?
    }
}

/// Run one write between `SAVEPOINT` and `RELEASE`, or roll it back alone.
fn in_savepoint<T>(
    conn: &Connection,
    context: &'static str,
    write: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    run(conn, "SAVEPOINT job").ctx(context)?;
    match write(conn) {
        Ok(value) => {
            run(conn, "RELEASE job").ctx(context)?;
            Ok(value)
        }
        Err(e) => {
            // Undo this write only; the batch goes on. A rollback that fails leaves
            // the transaction unusable, which the commit then reports to everyone.
            let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
            Err(e)
        }
    }
}

/// Run a statement without parameters from the statement cache (parsed once per
/// connection, not once per write).
fn run(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// A copy of an error for every write of a failed batch.
fn copy(error: &StoreError) -> StoreError {
    match error {
        StoreError::Busy => StoreError::Busy,
        StoreError::Full => StoreError::Full,
        StoreError::Damaged(m) => StoreError::Damaged(m.clone()),
        StoreError::Io(m) => StoreError::Io(m.clone()),
        other => StoreError::Backend {
            context: "committing a batch of writes",
            message: other.to_string(),
        },
    }
}

fn serve(conn: Connection, queue: Receiver<Box<dyn Job>>) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(BATCH);
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Takes the write lock first (other processes queue on it through the busy
        // timeout), so no write of the batch can deadlock on a lock upgrade.
        if let Err(e) = run(&conn, "BEGIN IMMEDIATE") {
            let error = classify("starting a batch of writes", e);
            for job in batch.drain(..) {
                job.fail(copy(&error));
            }
            continue;
        }
        let answers: Vec<Box<dyn Answer>> = batch.drain(..).map(|job| job.run(&conn)).collect();
        let committed = match run(&conn, "COMMIT") {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(classify("committing a batch of writes", e))
            }
        };
        for answer in answers {
            answer.give(match &committed {
                Ok(()) => Ok(()),
                Err(e) => Err(copy(e)),
            });
        }
    }
}
