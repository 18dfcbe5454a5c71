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
//! The writer survives its own failures:
//! - after FULL, IOERR, BUSY or NOMEM SQLite may roll back the whole transaction, not
//!   only the failed statement (`sqlite3_get_autocommit` turns true). The writes of
//!   the batch that ran before were undone with it and the ones after it would run
//!   outside any transaction (a `SAVEPOINT` outside one begins a transaction of its
//!   own, which its `RELEASE` commits: durable, yet reported failed). So after every
//!   write the writer checks that the transaction is still open; if not, every write
//!   of the batch fails with that error, the rest without running, and the next batch
//!   begins a new transaction;
//! - a write that panics is rolled back alone and answered with an error; the writer
//!   thread goes on.
//!
//! The queue is bounded: when it is full, a write fails at once with
//! [`StoreError::Busy`] (the http adapter answers 503 with `Retry-After`) instead of
//! waiting out a busy timeout.
//!
//! A checkpoint ([`Writer::checkpoint`], a clean stop's last step) queues like a
//! write, so it runs after every write queued before it is committed, outside any
//! batch (SQLite checkpoints only between transactions).

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sql::{Context, classify};
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

    /// The write's own error, if it failed.
    fn error(&self) -> Option<&StoreError>;
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

    fn error(&self) -> Option<&StoreError> {
        self.outcome.as_ref().err()
    }
}

/// What the writer thread is asked to do, in queue order.
enum Queued {
    Write(Box<dyn Job>),
    /// Fold the write-ahead log into the main file and truncate it.
    Checkpoint(oneshot::Sender<Result<(), StoreError>>),
}

/// The handle to a process's writer thread; cloned by every user of the store. The
/// thread ends when the last handle is dropped.
#[derive(Clone)]
pub(super) struct Writer {
    jobs: SyncSender<Queued>,
}

impl Writer {
    /// Start the writer thread on `conn`, which must be a connection of its own.
    pub(super) fn start(conn: Connection) -> std::io::Result<Writer> {
        let (jobs, queue) = sync_channel::<Queued>(QUEUE);
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
        self.queue(Queued::Write(job))?;
        answered.await.map_err(|_| stopped())?
    }

    /// After every write queued before it is committed, checkpoint the write-ahead log
    /// into the main file and truncate it (`PRAGMA wal_checkpoint(TRUNCATE)`).
    /// `Busy` when another connection (another process) kept it from completing.
    pub(super) async fn checkpoint(&self) -> Result<(), StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue(Queued::Checkpoint(answer))?;
        answered.await.map_err(|_| stopped())?
    }

    fn queue(&self, queued: Queued) -> Result<(), StoreError> {
        match self.jobs.try_send(queued) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(StoreError::Busy),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Pool("the database writer stopped".into())
}

/// `PRAGMA wal_checkpoint(TRUNCATE)` on the writer's connection, between batches: it
/// waits (through the busy timeout) for other processes' writers and readers, copies
/// every frame of the log into the main file, syncs it and truncates the log to zero
/// bytes. Its row says whether it completed (`busy` 0) and how many frames the log
/// held and how many were copied.
fn checkpoint(conn: &Connection) -> Result<(), StoreError> {
    let (busy, log, copied): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(|e| classify("checkpointing the write-ahead log", e))?;
    if busy != 0 {
        tracing::warn!(
            log_frames = log,
            copied_frames = copied,
            "the write-ahead log could not be checkpointed (another process uses the database): copy the -wal file with the database"
        );
        return Err(StoreError::Busy);
    }
    tracing::debug!(
        frames = copied,
        "write-ahead log checkpointed and truncated"
    );
    Ok(())
}

/// Run one write between `SAVEPOINT` and `RELEASE`, or roll it back alone: when it
/// fails, and when it panics (then its error says so, and the writer goes on).
fn in_savepoint<T>(
    conn: &Connection,
    context: &'static str,
    write: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    run(conn, "SAVEPOINT job").ctx(context)?;
    // Unwind safety: the connection's state after a panic is whatever SQLite says it
    // is (the statement reset when its handle dropped); the savepoint undoes the
    // write's changes, and nothing else the closure touched outlives it.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(conn)))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(StoreError::Backend {
                context,
                message: format!("the write panicked ({what}); it was rolled back"),
            })
        });
    match outcome {
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

fn serve(conn: Connection, queue: Receiver<Queued>) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(BATCH);
    while let Ok(first) = queue.recv() {
        // A checkpoint waits for the writes queued before it: it ends the batch, and
        // runs after its commit.
        let mut then_checkpoint = None;
        match first {
            Queued::Write(job) => batch.push(job),
            Queued::Checkpoint(answer) => then_checkpoint = Some(answer),
        }
        while then_checkpoint.is_none() && batch.len() < BATCH {
            match queue.try_recv() {
                Ok(Queued::Write(job)) => batch.push(job),
                Ok(Queued::Checkpoint(answer)) => then_checkpoint = Some(answer),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            commit_batch(&conn, &mut batch);
        }
        if let Some(answer) = then_checkpoint {
            let _ = answer.send(checkpoint(&conn));
        }
    }
}

/// Run `batch` (emptied) in one transaction and answer each of its writes.
fn commit_batch(conn: &Connection, batch: &mut Vec<Box<dyn Job>>) {
    // Takes the write lock first (other processes queue on it through the busy
    // timeout), so no write of the batch can deadlock on a lock upgrade.
    if let Err(e) = run(conn, "BEGIN IMMEDIATE") {
        let error = classify("starting a batch of writes", e);
        for job in batch.drain(..) {
            job.fail(copy(&error));
        }
        return;
    }
    let mut answers: Vec<Box<dyn Answer>> = Vec::with_capacity(batch.len());
    let mut jobs = batch.drain(..);
    for job in jobs.by_ref() {
        let answer = job.run(conn);
        // Still in the batch's transaction? A statement that failed with FULL, IOERR,
        // BUSY or NOMEM may have rolled all of it back.
        if conn.is_autocommit() {
            let error = answer.error().map_or_else(
                || StoreError::Backend {
                    context: "running a batch of writes",
                    message: "the transaction ended during a write".into(),
                },
                copy,
            );
            tracing::warn!(
                error = %error,
                "SQLite rolled back a whole batch of writes; each is answered with the error"
            );
            answers.push(answer);
            // No loss: nothing after it runs outside a transaction; every caller
            // hears the error (the failed write its own), none hears `Ok` for a
            // write that was undone. The next batch begins a new transaction.
            for job in jobs {
                job.fail(copy(&error));
            }
            for answer in answers {
                answer.give(Err(copy(&error)));
            }
            return;
        }
        answers.push(answer);
    }
    drop(jobs);
    let committed = match run(conn, "COMMIT") {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer on a fresh WAL file with one table `t(x)`, and the file.
    fn writer() -> (Writer, tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writer.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x TEXT);")
            .unwrap();
        (Writer::start(conn).unwrap(), dir, path)
    }

    /// Queue `write` now, in order (the public `write` queues when first polled).
    fn queue<F>(writer: &Writer, write: F) -> oneshot::Receiver<Result<(), StoreError>>
    where
        F: FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job = Box::new(Write {
            context: "a test write",
            write,
            answer,
        });
        writer.queue(Queued::Write(job)).unwrap();
        answered
    }

    fn insert(x: &'static str) -> impl FnOnce(&Connection) -> Result<(), StoreError> {
        move |conn| {
            conn.execute("INSERT INTO t (x) VALUES (?1)", [x])
                .map(drop)
                .ctx("a test insert")
        }
    }

    /// A test write, boxed so one batch can hold different ones.
    type TestWrite = Box<dyn FnOnce(&Connection) -> Result<(), StoreError> + Send>;

    /// Queue `writes` as one batch: behind a first write that holds the writer until
    /// they are all queued. Their answers, in order.
    async fn one_batch(writer: &Writer, writes: Vec<TestWrite>) -> Vec<Result<(), StoreError>> {
        let (started, running) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let first = queue(writer, move |_| {
            started.send(()).unwrap();
            gate.recv().unwrap();
            Ok(())
        });
        running.recv().unwrap();
        let answers: Vec<_> = writes.into_iter().map(|w| queue(writer, w)).collect();
        open.send(()).unwrap();
        first.await.unwrap().unwrap();
        let mut results = Vec::new();
        for answer in answers {
            results.push(answer.await.expect("every write is answered"));
        }
        results
    }

    fn rows(path: &std::path::Path) -> Vec<String> {
        let conn = Connection::open(path).unwrap();
        let mut stmt = conn.prepare("SELECT x FROM t ORDER BY rowid").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// A real SQLITE_FULL (the file may not grow: `max_page_count`) in the middle of
    /// a batch rolls the whole transaction back. Every write of the batch is then
    /// answered with an error and none is in the file: the one before it was undone,
    /// the one after it does not run (it would have committed alone, outside the
    /// batch, and been reported failed). The next batch works.
    #[tokio::test]
    async fn a_write_that_rolls_back_the_whole_batch_fails_the_batch_and_the_writer_goes_on() {
        let (writer, _dir, path) = writer();
        let full = |conn: &Connection| {
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap();
            conn.query_row(
                &format!("PRAGMA max_page_count = {}", pages + 2),
                [],
                |_| Ok(()),
            )
            .unwrap();
            let big = "x".repeat(100_000);
            conn.execute("INSERT INTO t (x) VALUES (?1)", [big])
                .map(drop)
                .ctx("a test insert that fills the file")
        };
        let results = one_batch(
            &writer,
            vec![
                Box::new(insert("before")),
                Box::new(full),
                Box::new(insert("after")),
            ],
        )
        .await;
        println!("answers: {results:?}; in the file: {:?}", rows(&path));
        assert!(
            matches!(results[1], Err(StoreError::Full)),
            "the write that filled the file: {:?}",
            results[1]
        );
        let acknowledged: Vec<&str> = ["before", "full", "after"]
            .into_iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(x, _)| x)
            .collect();
        assert_eq!(
            rows(&path),
            acknowledged,
            "what the callers were told is what the file holds"
        );
        assert!(results.iter().all(Result::is_err), "{results:?}");

        writer
            .write("a later write", insert("later"))
            .await
            .unwrap();
        assert_eq!(
            rows(&path),
            ["later"],
            "a new transaction for the next batch"
        );
    }

    /// A write that panics fails alone: rolled back, its caller answered with an
    /// error that says so; the other writes of its batch commit, and the writer
    /// thread serves the next ones.
    #[tokio::test]
    async fn a_panicking_write_fails_alone_and_the_writer_goes_on() {
        let (writer, _dir, path) = writer();
        let panics = |conn: &Connection| -> Result<(), StoreError> {
            conn.execute("INSERT INTO t (x) VALUES ('half done')", [])
                .unwrap();
            panic!("a bug in a write");
        };
        let results = one_batch(
            &writer,
            vec![
                Box::new(insert("before")),
                Box::new(panics),
                Box::new(insert("after")),
            ],
        )
        .await;
        println!("answers: {results:?}; in the file: {:?}", rows(&path));
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(&results[1], Err(StoreError::Backend { message, .. }) if message.contains("panicked")),
            "{:?}",
            results[1]
        );
        let later = writer.write("a later write", insert("later")).await;
        assert!(later.is_ok(), "the writer goes on: {later:?}");
        assert_eq!(rows(&path), ["before", "after", "later"]);
    }
}
