//! The SQLite backend: one database file shared by every lull process on a host.
//! One host, one clock: the callers' `now` is the clock every deadline is compared on
//! (the PostgreSQL backend, for several hosts, uses the database's clock instead).
//!
//! WAL journal (readers never block the writer), `busy_timeout` (writers queue
//! instead of failing at once), `synchronous = FULL` (a message acknowledged as
//! stored survives a crash of the process or the machine), and every write
//! transaction starts with `BEGIN IMMEDIATE`, so it takes the write lock before it
//! reads and can never deadlock on a lock upgrade. Blocking SQLite calls run on
//! tokio's blocking pool.
//!
//! # Layout
//! This file opens the database, inspects it (`lull check`) and hands out
//! connections; every write goes through the one writer (`writer.rs`, group commit).
//! The contract's areas are one file each, named as in the PostgreSQL backend and
//! the conformance suite: `messages.rs`, `leases.rs`, `rounds.rs`, `outbox.rs`,
//! `work.rs`, `limits.rs`, `actions.rs`, `settings.rs`, `reactions.rs`, `rhythm.rs`,
//! `overheard.rs`, `threads.rs`, `status.rs`, `jobs.rs`, `memories.rs`, `summaries.rs`. `sql.rs` holds the statement helpers
//! (errors with their context), `schema.rs` the migrations.

mod actions;
mod jobs;
mod leases;
mod limits;
mod memories;
mod messages;
mod outbox;
mod overheard;
mod reactions;
mod rhythm;
mod rounds;
pub(crate) mod schema;
mod settings;
mod sql;
mod status;
mod summaries;
mod threads;
mod work;
mod writer;

/// The SQLite schema version this build migrates to.
pub(crate) const SCHEMA: i64 = schema::LATEST;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lull_port::retry::Backoff;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::condition::Condition;
#[cfg(feature = "test-switches")]
use super::faults::FaultPlan;
use super::faults::Operation;
use super::lease_rows::LeaseRows;
use super::{AccessRule, StoreError, StoredSchedule};
use crate::timing::TimerPolicy;
use limits::read_access_rules;
use sql::Context;
use writer::Writer;

/// How long a writer waits for the write lock before reporting [`StoreError::Busy`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// [`BUSY_TIMEOUT`], or the test-only `LULL_TEST_BUSY_TIMEOUT_MS` (so a stress run can
/// hold the lock past it within a short lease).
fn busy_timeout() -> Duration {
    crate::switches::busy_timeout(BUSY_TIMEOUT)
}
/// Prepared statements kept per connection: more than the store has, so none is
/// parsed twice.
const STATEMENT_CACHE: usize = 96;
/// Reading connections per process (writes go through the one writer): reads are
/// short, and rounds mostly wait on the model, not the database.
const READERS: u32 = 4;

/// When a row stored at the caller's `now` was stored: one host, one clock, so both
/// times are that `now`.
fn stored_at(now: crate::domain::Timestamp) -> super::rules::StoredAt {
    super::rules::StoredAt {
        created_at: now,
        stored_at: now,
    }
}

/// A [`Store`](super::Store) on one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    /// Connections for reads (WAL: readers never wait for the writer).
    pool: r2d2::Pool<SqliteConnectionManager>,
    /// The process's one write connection, fed by a queue (group commit).
    writer: Writer,
    path: PathBuf,
    /// The capped debounce every timer is armed with: a setting of the deployment,
    /// fixed when the store is opened, not an argument of each call.
    timers: TimerPolicy,
    lease_rows: LeaseRows,
    /// A test's fault plan (all switches off unless a test set one).
    #[cfg(feature = "test-switches")]
    faults: Arc<FaultPlan>,
    /// What real operations found out about the file; `ping` reports it.
    condition: Arc<Condition>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

/// What [`SqliteStore::inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    /// No file yet: `lull run` creates it (in a folder that is `writable`, or fails).
    Missing { writable: bool },
    /// A sound file with its schema version (`latest` is this build's).
    Present {
        schema: i64,
        latest: i64,
        conversations: i64,
        /// The admins' run-time access decisions (`/allow`, `/deny`), oldest first.
        access: Vec<AccessRule>,
        /// The active jobs' schedules, soonest first.
        jobs: Vec<StoredSchedule>,
    },
}

impl SqliteStore {
    /// Open (creating if needed) the database at `path` and bring its schema up to
    /// date; timers are armed by `timers`. Safe to call from several processes at once.
    pub fn open(path: impl AsRef<Path>, timers: TimerPolicy) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let open_error = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
            && !parent.is_dir()
        {
            return Err(open_error(format!(
                "the folder {} does not exist",
                parent.display()
            )));
        }
        // A damaged file is refused before anything else touches it, with a message
        // that says so (the pool would only report that no connection came up).
        let probe = Connection::open(&path).map_err(|e| open_error(e.to_string()))?;
        probe
            .busy_timeout(busy_timeout())
            .map_err(|e| open_error(e.to_string()))?;
        verify_integrity(&probe).map_err(open_error)?;
        drop(probe);
        let manager = SqliteConnectionManager::file(&path).with_init(|conn| {
            conn.busy_timeout(busy_timeout())?;
            conn.execute_batch(
                "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA secure_delete = ON;",
            )?;
            // Every statement of the store fits the cache: each is parsed once.
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            // Every `conn.transaction()` is BEGIN IMMEDIATE (migrations included).
            conn.set_transaction_behavior(TransactionBehavior::Immediate);
            Ok(())
        });
        let pool = r2d2::Pool::builder()
            .max_size(READERS)
            .min_idle(Some(1))
            .connection_timeout(Duration::from_secs(10))
            .build(manager)
            .map_err(|e| open_error(e.to_string()))?;
        let mut conn = pool.get().map_err(|e| open_error(e.to_string()))?;
        // WAL is a property of the file: set once, it stays.
        let mode: String =
            retry_busy(|| conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)))
                .map_err(|e| open_error(format!("cannot switch to WAL: {e}")))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(open_error(format!(
                "journal mode is {mode}, WAL is required"
            )));
        }
        schema::migrate(&mut conn)
            .map_err(|e| open_error(format!("schema migration failed: {e}")))?;
        drop(conn);
        // Durable: a write is acknowledged only after its batch is synced to disk.
        let write_conn = Connection::open(&path).map_err(|e| open_error(e.to_string()))?;
        write_conn
            .busy_timeout(busy_timeout())
            .and_then(|()| {
                write_conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                write_conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA secure_delete = ON;")
            })
            .map_err(|e| open_error(e.to_string()))?;
        let writer = Writer::start(write_conn)
            .map_err(|e| open_error(format!("cannot start the database writer: {e}")))?;
        Ok(Self {
            pool,
            writer,
            path,
            timers,
            lease_rows: LeaseRows::Shared,
            #[cfg(feature = "test-switches")]
            faults: Arc::default(),
            condition: Arc::default(),
        })
    }

    /// The counter-test's switch: the same store and the same SQL, but every holder
    /// gets a private row for each lease, so no lease excludes anyone (claims never
    /// contend, fences pass, due work is never held back by a lease): processes race
    /// as if there were no lease (why, in `LeaseRows`). Exists only in builds with the
    /// `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub fn without_lease_checks(mut self) -> Self {
        self.lease_rows = LeaseRows::PerHolder;
        self
    }

    /// The same store, consulting `plan` where its writes reach the database: a test
    /// flips the plan's switches to make writes fail or renewals freeze. Exists only
    /// in builds with the `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub fn with_faults(mut self, plan: Arc<FaultPlan>) -> Self {
        self.faults = plan;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Look at the database at `path` without changing it (for `lull check`): no file
    /// is created, no schema migrated; the file is opened read-only and checked page
    /// by page.
    pub fn inspect(path: impl AsRef<Path>) -> Result<Inspection, StoreError> {
        let path = path.as_ref();
        let open_error = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        if !path.exists() {
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !folder.is_dir() {
                return Err(open_error(format!(
                    "the folder {} does not exist",
                    folder.display()
                )));
            }
            let writable = std::fs::metadata(folder)
                .map(|m| !m.permissions().readonly())
                .unwrap_or(false);
            return Ok(Inspection::Missing { writable });
        }
        // A WAL file exists while any process has the database open (or after a crash):
        // then a read-only connection uses it and creates nothing. Without one, nobody
        // writes the file, and it is read as immutable, which creates no WAL or
        // shared-memory file either.
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = if Path::new(&wal).exists() {
            Connection::open_with_flags(path, flags)
        } else {
            let uri = format!("file:{}?immutable=1", uri_path(path));
            Connection::open_with_flags(uri, flags | rusqlite::OpenFlags::SQLITE_OPEN_URI)
        }
        .map_err(|e| open_error(e.to_string()))?;
        conn.busy_timeout(busy_timeout())
            .map_err(|e| open_error(e.to_string()))?;
        verify_integrity(&conn).map_err(open_error)?;
        let schema: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| open_error(e.to_string()))?;
        let latest = schema::LATEST;
        if schema > latest {
            return Err(open_error(format!(
                "the schema is at version {schema}, newer than this lull knows ({latest}): run the newer lull"
            )));
        }
        let conversations = if schema == 0 {
            0
        } else {
            conn.prepare_cached("SELECT COUNT(*) FROM conversations")
                .ctx("preparing a statement")?
                .query_row([], |r| r.get(0))
                .map_err(|e| open_error(e.to_string()))?
        };
        // The access decisions arrived with schema 4.
        let access = if schema >= 4 {
            read_access_rules(&conn).map_err(|e| open_error(e.to_string()))?
        } else {
            Vec::new()
        };
        // The jobs arrived with schema 19.
        let jobs = if schema >= 19 {
            read_schedules(&conn).map_err(|e| open_error(e.to_string()))?
        } else {
            Vec::new()
        };
        Ok(Inspection::Present {
            schema,
            latest,
            conversations,
            access,
            jobs,
        })
    }

    /// Run `f` with a pooled connection on the blocking pool.
    async fn with_conn<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let result = self.on_blocking_pool(f).await;
        self.condition.observe(&result, false);
        result
    }

    async fn on_blocking_pool<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.get().map_err(|e| StoreError::Pool(e.to_string()))?;
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Pool(format!("database task failed: {e}")))?
    }

    /// Run `f` as one write of the writer's next batch (see `writer`): answered once
    /// the batch is committed, rolled back alone if it fails.
    async fn write<T, F>(&self, context: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.write_as(Operation::Other, context, f).await
    }

    /// [`SqliteStore::write`] for a write a fault plan tells apart: the one place a
    /// write reaches the database, where a test's plan is consulted (test builds).
    #[cfg_attr(not(feature = "test-switches"), allow(unused_variables))]
    async fn write_as<T, F>(
        &self,
        operation: Operation,
        context: &'static str,
        f: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let result = async {
            #[cfg(feature = "test-switches")]
            self.faults.before_write(operation)?;
            self.writer.write(context, f).await
        }
        .await;
        self.condition.observe(&result, true);
        result
    }
}

/// A file path as the path of a SQLite `file:` URI: the characters a URI gives a
/// meaning (`%`, `?`, `#`) percent-encoded.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Refuse a damaged file at start rather than refuse every message later.
/// `quick_check` reads every page of the file (not the index contents).
fn verify_integrity(conn: &Connection) -> Result<(), String> {
    let verdict: rusqlite::Result<String> =
        conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0));
    match verdict {
        Ok(verdict) if verdict == "ok" => Ok(()),
        Ok(problem) => Err(format!(
            "the database file is damaged ({problem}); restore it from a backup"
        )),
        Err(e) => Err(format!(
            "the database file is damaged ({e}); restore it from a backup"
        )),
    }
}

/// Retry a statement that found the file locked in a way busy_timeout does not cover
/// (switching the journal mode while another process opens the file).
/// Between tries of a start-up statement that found the database locked by another
/// process (about 40 ms each, jittered: the locker is another start-up, short).
const BUSY_AT_OPEN: Backoff = Backoff::new(Duration::from_millis(40), Duration::from_millis(40));

fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let mut attempt = 0;
    loop {
        match f() {
            Err(e)
                if attempt < 50
                    && matches!(
                        e.sqlite_error_code(),
                        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                    ) =>
            {
                attempt += 1;
                std::thread::sleep(BUSY_AT_OPEN.delay(attempt));
            }
            other => return other,
        }
    }
}

/// The active jobs' schedules, for the inspection.
fn read_schedules(conn: &Connection) -> rusqlite::Result<Vec<StoredSchedule>> {
    let mut statement = conn.prepare(super::STORED_SCHEDULES)?;
    let rows = statement.query_map([], |r| {
        Ok(StoredSchedule {
            id: r.get(0)?,
            schedule: r.get(1)?,
            timezone: r.get(2)?,
            next_at: r.get::<_, Option<i64>>(3)?.map(crate::domain::Timestamp),
        })
    })?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::actions::{ACTIONS_OF_BATCH_SQL, OPEN_APPROVALS_SQL};
    use super::outbox::READ_OWED_SQL;
    use super::sql::placeholders;
    use super::work::{due_candidates_sql, next_deadline_sql};
    use super::*;

    #[test]
    fn uri_paths_escape_what_uris_give_a_meaning() {
        assert_eq!(
            uri_path(Path::new("/data/a?b#c%d.db")),
            "/data/a%3fb%23c%25d.db"
        );
    }

    #[test]
    fn inspecting_a_file_with_odd_characters_in_its_name_works() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("odd?name#1%.db");
        drop(Connection::open(&path).unwrap());
        assert!(matches!(
            SqliteStore::inspect(&path).unwrap(),
            Inspection::Present { schema: 0, .. }
        ));
    }

    /// A connection to a fresh database file at the latest schema, with its folder.
    fn migrated() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.db");
        let policy = TimerPolicy::new(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(4),
            4,
        )
        .unwrap();
        drop(SqliteStore::open(&path, policy).unwrap());
        (dir, Connection::open(&path).unwrap())
    }

    /// The scheduler's queries read what is due, never every conversation or timer:
    /// each table they name is reached by a search on an index (a `SCAN` is allowed
    /// only over their own small intermediate results), so an idle pass costs the same
    /// with ten thousand conversations as with none.
    #[test]
    fn due_work_searches_indexes_and_walks_no_table() {
        let (_dir, conn) = migrated();
        let list = placeholders(5, 2);
        // And a claim's read of what a conversation owes (`read_owed`), on the writer
        // thread every ingest waits for: one conversation's rows, not every one's.
        for sql in [
            due_candidates_sql(&list),
            next_deadline_sql(&list),
            READ_OWED_SQL.to_owned(),
        ] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let params: Vec<rusqlite::types::Value> = vec![
                0i64.into(),
                0i64.into(),
                "h".to_owned().into(),
                0i64.into(),
                "http".to_owned().into(),
                "telegram".to_owned().into(),
            ];
            let params = &params[..stmt.parameter_count()];
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            println!(
                "{}\n  plan: {plan:#?}",
                sql.split_whitespace().collect::<Vec<_>>().join(" ")
            );
            if sql == READ_OWED_SQL {
                assert!(
                    plan.iter().any(|step| step.starts_with(
                        "SEARCH o USING INDEX outbox_undelivered (conversation_id=?)"
                    )),
                    "read_owed searches outbox_undelivered by conversation: {plan:#?}"
                );
            }
            for step in &plan {
                let walks_a_table = step.starts_with("SCAN ")
                    && !step.starts_with("SCAN (")
                    && !step.starts_with("SCAN g");
                // A search on the conversations by platform alone is a walk too.
                let walks_conversations = step.contains("conversations_1 (platform=?)");
                assert!(
                    !walks_a_table && !walks_conversations,
                    "{step}\nin the plan {plan:#?}\nof {sql}"
                );
            }
        }
    }

    /// The journal's reads search their indexes: a batch's actions by
    /// (conversation, batch), open approvals by the partial index of open questions,
    /// already in id order (no table walk, no sort).
    #[test]
    fn the_journal_reads_search_their_indexes() {
        let (_dir, conn) = migrated();
        for (sql, search) in [
            (
                ACTIONS_OF_BATCH_SQL,
                "SEARCH actions USING INDEX actions_batch (conversation_id=? AND batch=?)",
            ),
            (
                OPEN_APPROVALS_SQL,
                "SEARCH actions USING INDEX actions_open (conversation_id=?)",
            ),
        ] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map([0i64, 0i64], |r| r.get::<_, String>(3))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert_eq!(plan, [search], "{sql}");
        }
    }

    /// The status page's reads are range scans on indexes: no statement walks a
    /// table (a `SCAN` only over its own grouped result or a partial index of what it
    /// counts), so a refreshing page costs
    /// the same with a year of replies as with a day's.
    #[test]
    fn the_status_reads_search_their_indexes() {
        use super::status::*;
        let (_dir, conn) = migrated();
        for (sql, search) in [
            (LIVE_LEASES_SQL, "USING INDEX leases_held"),
            (HELD_SQL, "INDEX timers_held"),
            (RETRYING_SQL, "INDEX timers_retrying"),
            (SENT_SQL, "USING INDEX outbox_sent"),
            (FAILED_SQL, "USING INDEX outbox_failed"),
            (CREATED_SQL, "USING INDEX outbox_created"),
            (
                TOKENS_SQL,
                "USING INDEX sqlite_autoindex_token_usage_1 (scope=? AND day>? AND day<?)",
            ),
            (TOP_SQL, "USING INDEX token_usage_by_day (day=?"),
            (TOP_ROW_SQL, "USING INDEX outbox_history"),
        ] {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let params = [0i64, 5i64, 0i64];
            let plan: Vec<String> = stmt
                .query_map(
                    rusqlite::params_from_iter(params[..stmt.parameter_count()].iter()),
                    |r| r.get::<_, String>(3),
                )
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(
                plan.iter().any(|step| step.contains(search)),
                "{search} in {plan:#?}\nof {sql}"
            );
            println!("{sql}\n  plan: {plan:#?}");
            for step in &plan {
                // A scan of the partial index of retrying timers reads those alone.
                let walks_a_table = step.starts_with("SCAN ")
                    && step != "SCAN t"
                    && step != "SCAN timers USING INDEX timers_retrying";
                assert!(!walks_a_table, "{step}\nin the plan {plan:#?}\nof {sql}");
            }
        }
    }

    /// A console change finds its chat by the primary key, whatever the number of
    /// conversations (the list's one pass is for the list alone).
    #[test]
    fn one_chat_is_read_by_its_primary_key() {
        let (_dir, conn) = migrated();
        let sql = super::status::CHAT_SQL;
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = stmt
            .query_map(rusqlite::params![0i64, 5i64], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.starts_with("SEARCH c USING INTEGER PRIMARY KEY")),
            "{plan:#?}"
        );
        assert!(
            !plan.iter().any(|step| step.starts_with("SCAN c")),
            "{plan:#?}"
        );
    }
}
