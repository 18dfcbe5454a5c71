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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lull_port::retry::Backoff;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

mod writer;

use writer::Writer;

use super::condition::Condition;
#[cfg(feature = "test-switches")]
use super::faults::FaultPlan;
use super::faults::Operation;
use super::lease_rows::{LeaseRow, LeaseRows};
use super::rules::DueScan;
use super::{
    AccessRule, Batch, Charged, Claimed, CommitOutcome, DueWork, Exchange, IngestOutcome,
    LeaseStore, LimitStore, MessageEdit, MessageStore, NewMessage, NewNotice, NewReply, OutboxKind,
    OutboxRow, OutboxStore, PartSent, PendingMessage, RateHold, RateWindow, RecentConversation,
    Reservation, RoundStore, StoreError, TimerState, TokenCharge, WorkQuery, WorkStore,
};
use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, LeaseToken, OutboxId, Platform,
    Said, Timestamp, Version,
};
use crate::timing::TimerPolicy;

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
    },
}

/// Attaches what we were doing to a SQLite error and sorts out the conditions a
/// caller can wait out (busy, full) from real failures.
trait Context<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, rusqlite::Error> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| classify(context, source))
    }
}

fn classify(context: &'static str, source: rusqlite::Error) -> StoreError {
    match source.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
        Some(ErrorCode::DiskFull) => StoreError::Full,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            StoreError::Damaged(format!("{source}, while {context}"))
        }
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::ReadOnly
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied,
        ) => StoreError::Io(format!("{source}, while {context}")),
        _ => StoreError::Backend {
            context,
            message: source.to_string(),
        },
    }
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
            conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
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
        migrate(&mut conn).map_err(|e| open_error(format!("schema migration failed: {e}")))?;
        drop(conn);
        // Durable: a write is acknowledged only after its batch is synced to disk.
        let write_conn = Connection::open(&path).map_err(|e| open_error(e.to_string()))?;
        write_conn
            .busy_timeout(busy_timeout())
            .and_then(|()| {
                write_conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                write_conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
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
        let latest = super::migrations::LATEST;
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
        Ok(Inspection::Present {
            schema,
            latest,
            conversations,
            access,
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

/// Bring the schema up to date. Several processes starting on a fresh file race
/// here: the loser's migration fails (the tables exist by then) and it tries again,
/// finding the schema current.
fn migrate(conn: &mut Connection) -> Result<(), rusqlite_migration::Error> {
    let migrations = super::migrations::migrations();
    let mut attempt = 0;
    loop {
        match migrations.to_latest(conn) {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "schema migration raced another process; retrying");
                std::thread::sleep(Duration::from_millis(50 * attempt));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Find or create a conversation row; returns its id. A conversation seen once as a
/// group stays a group: no platform turns a group into a private chat, so an update
/// that does not say (a command, a notice) can never make one private.
fn upsert_conversation(
    tx: &Connection,
    conversation: &ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<ConversationId, StoreError> {
    tx.prepare_cached("INSERT INTO conversations (platform, key, is_group, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (platform, key) DO UPDATE SET is_group = conversations.is_group OR excluded.is_group
         RETURNING id")
        .ctx("preparing a statement")?
        .query_row(params![
            conversation.platform.as_str(),
            conversation.key,
            is_group,
            now.0
        ],
        |r| r.get(0),)
    .map(ConversationId)
    .ctx("finding a conversation")
}

/// Bump the version of a conversation that just got a message (or an edit) and arm
/// its timer. Must run in the transaction that stored the message.
fn bump_and_arm(
    tx: &Connection,
    conversation: ConversationId,
    platform: Platform,
    policy: TimerPolicy,
    holder: &HolderId,
    now: Timestamp,
) -> Result<(Version, Timestamp), StoreError> {
    // Version counter: bumped in the same transaction that stores the message.
    let (version, answered): (i64, i64) = tx
        .prepare_cached(
            "UPDATE conversations SET version = version + 1 WHERE id = ?1
             RETURNING version, answered_version",
        )
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| Ok((r.get(0)?, r.get(1)?)))
        .ctx("bumping the version")?;
    let (pending, first_pending) = pending_after(tx, conversation, answered)?;
    let due_at = policy.due_at(now, first_pending.unwrap_or(now), pending);
    // Capped debounce: every message re-arms the timer, never past the cap, and never
    // sooner than a failed generation's backoff (`retry_at`) or a limit's hold
    // (`held_until`).
    let due_at: i64 = tx.prepare_cached("INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (conversation_id) DO UPDATE SET
                 due_at = MAX(excluded.due_at, timers.retry_at, timers.held_until),
                 armed_version = excluded.armed_version,
                 armed_at = excluded.armed_at,
                 armed_by = excluded.armed_by
             RETURNING due_at")
        .ctx("preparing a statement")?
        .query_row(params![
                conversation.0,
                platform.as_str(),
                due_at.0,
                version,
                now.0,
                holder.as_str()
            ],
            |r| r.get(0),)
        .ctx("arming the timer")?;
    let due_at = Timestamp(due_at);
    Ok((Version(version), due_at))
}

/// How many messages are pending after `answered` and when the oldest arrived.
fn pending_after(
    tx: &Connection,
    conversation: ConversationId,
    answered: i64,
) -> Result<(u32, Option<Timestamp>), StoreError> {
    tx.prepare_cached(
        "SELECT COUNT(*), MIN(received_at) FROM messages
         WHERE conversation_id = ?1 AND version > ?2",
    )
    .ctx("preparing a statement")?
    .query_row(params![conversation.0, answered], |r| {
        Ok((
            r.get::<_, i64>(0)? as u32,
            r.get::<_, Option<i64>>(1)?.map(Timestamp),
        ))
    })
    .ctx("counting pending messages")
}

/// Exclusive: a write under a lease needs the live holder with the current token in
/// the lease's row (`resource`).
fn ensure_lease(
    tx: &Connection,
    lease: &Lease,
    resource: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let ours: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM leases
                 WHERE resource = ?1 AND holder = ?2 AND token = ?3 AND expires_at > ?4)",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![resource, lease.holder.as_str(), lease.token.0, now.0],
            |r| r.get(0),
        )
        .ctx("checking the lease")?;
    if ours {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(lease.key.clone()))
    }
}

fn conversation_of(lease: &Lease) -> ConversationId {
    lease.key.conversation().unwrap_or_else(|| {
        panic!(
            "a poller lease ({}) was used for conversation work",
            lease.key
        )
    })
}

/// Conversations with work due by `?1` (timers due, outbox heads due), with their
/// lease; `list`: the platform placeholders. Every part is a range scan or a seek
/// over what is due (index `timers_due`; index `outbox_due` walked first, then the
/// conversation by its key: `INDEXED BY` and `CROSS JOIN` fix that order, which the
/// planner, without statistics, would otherwise turn into a walk over every
/// conversation of the platform), so a pass costs the same whatever the database holds.
fn due_candidates_sql(list: &str) -> String {
    format!(
        "SELECT g.conversation_id, g.at, l.holder, l.expires_at FROM (
             SELECT conversation_id, MIN(at) AS at FROM (
                 SELECT conversation_id,
                        due_at + CASE WHEN armed_by = ?3 THEN 0 ELSE ?4 END AS at
                 FROM timers WHERE platform IN ({list}) AND due_at <= ?1
                 UNION ALL
                 SELECT o.conversation_id,
                        o.next_attempt_at + CASE WHEN o.owner = ?3 THEN 0 ELSE ?4 END
                 FROM outbox o INDEXED BY outbox_due CROSS JOIN conversations c ON c.id = o.conversation_id
                 WHERE o.sent_at IS NULL AND o.failed_at IS NULL
                   AND o.next_attempt_at <= ?1 AND c.platform IN ({list})
                   AND NOT EXISTS (SELECT 1 FROM outbox p
                                   WHERE p.conversation_id = o.conversation_id
                                     AND p.id < o.id
                                     AND p.sent_at IS NULL AND p.failed_at IS NULL))
             GROUP BY conversation_id) g
         LEFT JOIN leases l ON l.conversation_id = g.conversation_id"
    )
}

/// The earliest future timer and outbox retry: one index seek each.
fn next_deadline_sql(list: &str) -> String {
    format!(
        "SELECT MIN(at) FROM (
             SELECT MIN(due_at) AS at FROM timers
             WHERE platform IN ({list}) AND due_at > ?1
             UNION ALL
             SELECT MIN(next_attempt_at) FROM outbox
             WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at > ?1)"
    )
}

/// `?N, ?N+1, …` placeholders for an IN list starting at parameter `first`.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl MessageStore for SqliteStore {
    async fn ingest(
        &self,
        message: NewMessage,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let holder = holder.clone();
        let policy = self.timers;
        self.write_as(Operation::Intake, "storing a message", move |tx| {
            let conversation = upsert_conversation(tx, &message.conversation, message.is_group, now)?;
            // No duplicate: a redelivered platform message is stored once.
            let inserted = tx.prepare_cached("INSERT INTO messages
                         (conversation_id, platform_message_id, user_id, author, text, version, received_at, media)
                     SELECT ?1, ?2, ?3, ?4, ?5, version + 1, ?6, ?7 FROM conversations WHERE id = ?1
                     ON CONFLICT (conversation_id, platform_message_id) DO NOTHING")
        .ctx("preparing a statement")?
        .execute(params![
                        conversation.0,
                        message.message_id,
                        message.user_id,
                        message.author,
                        message.text,
                        now.0,
                        super::encode_media(&message.media)
                    ],)
                .ctx("storing a message")?;
            if inserted == 0 {
                return Ok(IngestOutcome::Duplicate { conversation });
            }
            let (version, due_at) =
                bump_and_arm(tx, conversation, message.conversation.platform, policy, &holder, now)?;
            Ok(IngestOutcome::Stored {
                conversation,
                version,
                due_at,
            })
        })
        .await
    }

    async fn edit(
        &self,
        edit: MessageEdit,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let holder = holder.clone();
        let policy = self.timers;
        self.write_as(Operation::Intake, "editing a message", move |tx| {
            let found: Option<(i64, i64)> = tx.prepare_cached("SELECT id, answered_version FROM conversations WHERE platform = ?1 AND key = ?2")
        .ctx("preparing a statement")?
        .query_row(params![edit.conversation.platform.as_str(), edit.conversation.key],
                    |r| Ok((r.get(0)?, r.get(1)?)),)
                .optional()
                .ctx("finding a conversation")?;
            let Some((id, answered)) = found else {
                return Ok(IngestOutcome::EditIgnored);
            };
            // Edits: only a still-pending message changes, and it counts as new.
            let changed = tx.prepare_cached("UPDATE messages
                     SET text = ?1, version = (SELECT version + 1 FROM conversations WHERE id = ?2)
                     WHERE conversation_id = ?2 AND platform_message_id = ?3
                       AND version > ?4 AND text <> ?1")
        .ctx("preparing a statement")?
        .execute(params![edit.text, id, edit.message_id, answered],)
                .ctx("editing a message")?;
            if changed == 0 {
                return Ok(IngestOutcome::EditIgnored);
            }
            // Rate limit: an applied edit counts in its author's window, as a message.
            tx.prepare_cached("INSERT INTO edits (message_id, user_id, platform, edited_at)
                     SELECT id, user_id, ?3, ?4 FROM messages WHERE conversation_id = ?1 AND platform_message_id = ?2")
        .ctx("preparing a statement")?
        .execute(params![id, edit.message_id, edit.conversation.platform.as_str(), now.0])
                .ctx("recording an edit")?;
            let conversation = ConversationId(id);
            let (version, due_at) = bump_and_arm(tx, conversation, edit.conversation.platform, policy, &holder, now)?;
            Ok(IngestOutcome::Stored {
                conversation,
                version,
                due_at,
            })
        })
        .await
    }

    async fn reset_context(
        &self,
        conversation: &ConversationRef,
        is_group: bool,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let conversation = conversation.clone();
        let holder = holder.clone();
        self.write("resetting the context", move |tx| {
            let id = upsert_conversation(tx, &conversation, is_group, now)?;
            tx.prepare_cached("UPDATE conversations SET context_version = version WHERE id = ?1")
                .ctx("preparing a statement")?
                .execute([id.0])
                .ctx("resetting the context")?;
            // /reset unsticks: pending messages are tried again now, without the
            // backoff, but not before a limit's hold ends (limits: not a way around them).
            tx.prepare_cached(
                "UPDATE timers SET attempts = 0, retry_at = 0, armed_by = ?3,
                     due_at = MAX(CASE WHEN due_at > ?2 THEN ?2 ELSE due_at END, held_until)
                 WHERE conversation_id = ?1",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, now.0, holder.as_str()])
            .ctx("clearing the failure backoff")?;
            Ok(())
        })
        .await
    }

    async fn recent_conversations(
        &self,
        platform: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RecentConversation>, StoreError> {
        self.with_conn(move |conn| {
            // No loss: catch-up resumes after the message stored last (the highest row
            // id), never after one that merely has a larger platform id.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT c.key, c.is_group, m.platform_message_id
                     FROM conversations c
                     JOIN messages m ON m.id = (SELECT MAX(id) FROM messages WHERE conversation_id = c.id)
                     WHERE c.platform = ?1 AND m.received_at >= ?2
                     ORDER BY m.received_at DESC, m.id DESC
                     LIMIT ?3",
                )
                .ctx("finding recent conversations")?;
            stmt.query_map(params![platform.as_str(), since.0, limit as i64], |r| {
                Ok(RecentConversation {
                    conversation: ConversationRef::new(platform, r.get::<_, String>(0)?),
                    is_group: r.get(1)?,
                    last_message_id: r.get(2)?,
                })
            })
            .ctx("finding recent conversations")?
            .collect::<Result<Vec<_>, _>>()
            .ctx("finding recent conversations")
        })
        .await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim_lease(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Lease>, StoreError> {
        let key = key.clone();
        let holder = holder.clone();
        let row = self.lease_rows.row(&key, &holder);
        self.write("claiming a lease", move |tx| {
            claim(tx, key, holder, &row, ttl, now)
        })
        .await
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        let mut lease = lease.clone();
        let expires_at = now.plus(ttl);
        #[cfg(feature = "test-switches")]
        if self.faults.renewals_frozen() {
            // A frozen process: it believes it renewed; the database never heard of it.
            lease.expires_at = expires_at;
            return Ok(lease);
        }
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("renewing a lease", move |tx| {
            // Exclusive: only the live holder with this fencing token extends the lease.
            let changed = tx
                .prepare_cached(
                    "UPDATE leases SET expires_at = ?4
                     WHERE resource = ?1 AND holder = ?2 AND token = ?3 AND expires_at > ?5",
                )
                .ctx("preparing a statement")?
                .execute(params![
                    row.resource,
                    lease.holder.as_str(),
                    lease.token.0,
                    expires_at.0,
                    now.0
                ])
                .ctx("renewing a lease")?;
            if changed == 0 {
                return Err(StoreError::LeaseLost(lease.key.clone()));
            }
            lease.expires_at = expires_at;
            Ok(lease)
        })
        .await
    }

    async fn release_lease(
        &self,
        lease: &Lease,
        last_sent: Option<PartSent>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("releasing a lease", move |tx| {
            if let Some(sent) = last_sent {
                mark_part_sent(tx, sent, now)?;
            }
            // Only our own claim is released: a lease taken over since stays with its holder.
            tx.prepare_cached("UPDATE leases SET holder = NULL WHERE resource = ?1 AND holder = ?2 AND token = ?3")
        .ctx("preparing a statement")?
        .execute(params![row.resource, lease.holder.as_str(), lease.token.0],)
            .ctx("releasing a lease")?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl RoundStore for SqliteStore {
    async fn claim_round(
        &self,
        conversation: ConversationId,
        holder: &HolderId,
        ttl: Duration,
        history: usize,
        now: Timestamp,
    ) -> Result<Option<Claimed>, StoreError> {
        let key = LeaseKey::Conversation(conversation);
        let holder = holder.clone();
        let row = self.lease_rows.row(&key, &holder);
        self.write("claiming a round", move |tx| {
            let Some(lease) = claim(tx, key, holder, &row, ttl, now)? else {
                return Ok(None);
            };
            give_back_orphans(tx, conversation, lease.token)?;
            // What the round works on, read under the lease it just claimed.
            let batch = read_batch(tx, conversation, history)?;
            let owed = read_owed(tx, conversation, now)?;
            Ok(Some(Claimed {
                lease,
                batch,
                owed: owed.rows,
                held_back: owed.held_back,
            }))
        })
        .await
    }

    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError> {
        self.with_conn(move |conn| {
            // One read snapshot (WAL): version, pending messages and timer agree.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .ctx("collecting a batch")?;
            read_batch(&tx, conversation, history)
        })
        .await
    }

    async fn commit_reply(
        &self,
        lease: &Lease,
        batch: &Batch,
        reply: NewReply,
        now: Timestamp,
    ) -> Result<CommitOutcome, StoreError> {
        let lease = lease.clone();
        let conversation = batch.conversation_id;
        let v0 = batch.v0;
        let covered: Vec<i64> = batch.pending.iter().map(|m| m.row).collect();
        let message_ids: Vec<(i64, String)> = batch
            .pending
            .iter()
            .map(|m| (m.row, m.message_id.clone()))
            .collect();
        let reference = batch.conversation.clone();
        let reply_to = batch.last_message_id().map(str::to_owned);
        let oldest = batch.oldest_pending_at().unwrap_or(now);
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let policy = self.timers;
        self.write("committing a reply", move |tx| {
            ensure_lease(tx, &lease, &row.resource, now)?;
            let version: i64 = tx.prepare_cached("SELECT version FROM conversations WHERE id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| r.get(0))
                .ctx("reading the version")?;
            // Fresh: a reply is committed only if no message arrived since it was
            // collected, unless the cap forces it out.
            let forced = version != v0.0;
            if forced && !policy.cap_reached(now, oldest) {
                return Ok(CommitOutcome::Stale {
                    version: Version(version),
                });
            }
            // No duplicate: a message edited since it was collected is pending again
            // (its version is past v0), so the reply covers only what is unchanged.
            let covered = if forced {
                unchanged_since(tx, &covered, v0)?
            } else {
                covered
            };
            if covered.is_empty() {
                return Ok(CommitOutcome::Stale {
                    version: Version(version),
                });
            }
            let usage = reply.usage.unwrap_or_default();
            let outbox: i64 = tx.prepare_cached("INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token, forced,
                                         prompt_tokens, completion_tokens, llm_ms, owner, created_at, next_attempt_at)
                     VALUES (?1, 'reply', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?11, ?10, ?10)
                     RETURNING id")
        .ctx("preparing a statement")?
        .query_row(params![
                        conversation.0,
                        &reply.text,
                        reply_to,
                        v0.0,
                        lease.token.0,
                        forced,
                        reply.usage.map(|_| usage.prompt as i64),
                        reply.usage.map(|_| usage.completion as i64),
                        reply.llm_ms as i64,
                        now.0,
                        lease.holder.as_str()
                    ],
                    |r| r.get(0),)
                .ctx("storing a reply")?;
            record_covers(tx, outbox, &covered)?;
            let notices = store_held_out(tx, &lease, &reference, &reply.held_out, v0, forced, now)?;
            answer_through(tx, conversation, v0, policy)?;
            Ok(CommitOutcome::Committed {
                notices,
                outbox: OutboxRow {
                    id: OutboxId(outbox),
                    conversation: reference,
                    kind: OutboxKind::Reply,
                    text: reply.text,
                    reply_to,
                    covers: message_ids
                        .into_iter()
                        .filter(|(row, _)| covered.contains(row))
                        .map(|(_, id)| id)
                        .collect(),
                    parts_sent: 0,
                    attempts: 0,
                    created_at: now,
                    stored_at: now,
                },
                forced,
            })
        })
        .await
    }

    async fn give_up(
        &self,
        lease: &Lease,
        batch: &Batch,
        notice: &str,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError> {
        let lease = lease.clone();
        let conversation = batch.conversation_id;
        let v0 = batch.v0;
        let reply_to = batch.last_message_id().map(str::to_owned);
        let reference = batch.conversation.clone();
        let notice = notice.to_owned();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let policy = self.timers;
        self.write("giving up on a batch", move |tx| {
            ensure_lease(tx, &lease, &row.resource, now)?;
            // What this give-up ends: messages still pending up to v0 (an edit since
            // the batch was collected moved its message past v0: it stays pending).
            // No duplicate: a message already covered is never covered again.
            let covered: Vec<(i64, String)> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT m.id, m.platform_message_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE c.id = ?1 AND m.version > c.answered_version AND m.version <= ?2
                           AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
                         ORDER BY m.id",
                    )
                    .ctx("finding the messages given up on")?;
                stmt.query_map(params![conversation.0, v0.0], |r| Ok((r.get(0)?, r.get(1)?)))
                    .ctx("finding the messages given up on")?
                    .collect::<Result<_, _>>()
                    .ctx("finding the messages given up on")?
            };
            if covered.is_empty() {
                return Ok(None);
            }
            let outbox: i64 = tx.prepare_cached("INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                         owner, created_at, next_attempt_at)
                     VALUES (?1, 'notice', ?2, ?3, ?4, ?5, ?6, ?7, ?7)
                     RETURNING id")
        .ctx("preparing a statement")?
        .query_row(params![
                        conversation.0,
                        &notice,
                        reply_to,
                        v0.0,
                        lease.token.0,
                        lease.holder.as_str(),
                        now.0
                    ],
                    |r| r.get(0),)
                .ctx("storing a give-up notice")?;
            let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
            record_covers(tx, outbox, &rows)?;
            answer_through(tx, conversation, v0, policy)?;
            Ok(Some(OutboxRow {
                id: OutboxId(outbox),
                conversation: reference,
                kind: OutboxKind::Notice,
                text: notice,
                reply_to,
                covers: covered.into_iter().map(|(_, id)| id).collect(),
                parts_sent: 0,
                attempts: 0,
                created_at: now,
                stored_at: now,
            }))
        })
        .await
    }

    async fn store_transcript(
        &self,
        lease: &Lease,
        message: i64,
        transcript: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let lease = lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        let transcript = transcript.to_owned();
        self.write("storing a transcript", move |tx| {
            ensure_lease(tx, &lease, &row.resource, now)?;
            let conversation = conversation_of(&lease);
            // Transcribed once: a transcript already stored is never replaced.
            let stored = tx
                .execute(
                    "UPDATE messages SET transcript = ?3
                     WHERE id = ?1 AND conversation_id = ?2 AND transcript IS NULL",
                    params![message, conversation.0, transcript],
                )
                .ctx("storing a transcript")?;
            Ok(stored == 1)
        })
        .await
    }

    async fn disarm_idle_timer(
        &self,
        lease: &Lease,
        v0: Version,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("disarming an idle timer", move |tx| {
            ensure_lease(tx, &lease, &row.resource, now)?;
            let conversation = conversation_of(&lease);
            tx.prepare_cached("DELETE FROM timers WHERE conversation_id = ?1 AND armed_version <= ?2
                   AND NOT EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                   WHERE c.id = ?1 AND m.version > c.answered_version)")
        .ctx("preparing a statement")?
        .execute(params![conversation.0, v0.0],)
            .ctx("disarming an idle timer")?;
            Ok(())
        })
        .await
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        retry_at: Timestamp,
        now: Timestamp,
    ) -> Result<u32, StoreError> {
        let lease = lease.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("recording a failed generation", move |tx| {
            ensure_lease(tx, &lease, &row.resource, now)?;
            let conversation = conversation_of(&lease);
            let attempts: Option<u32> = tx
                .prepare_cached(
                    "UPDATE timers SET attempts = attempts + 1, retry_at = ?2,
                         due_at = CASE WHEN due_at < ?2 THEN ?2 ELSE due_at END
                     WHERE conversation_id = ?1 RETURNING attempts",
                )
                .ctx("preparing a statement")?
                .query_row(params![conversation.0, retry_at.0], |r| r.get(0))
                .optional()
                .ctx("recording a failed generation")?;
            Ok(attempts.unwrap_or(0))
        })
        .await
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn enqueue_notice(
        &self,
        notice: NewNotice,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError> {
        let holder = holder.clone();
        self.write("queueing a notice", move |tx| {
            let conversation = upsert_conversation(tx, &notice.conversation, notice.is_group, now)?;
            // At most one notice per dedupe key.
            let id: Option<i64> = tx.prepare_cached("INSERT INTO outbox (conversation_id, kind, text, reply_to, dedupe_key, owner, created_at, next_attempt_at)
                     VALUES (?1, 'notice', ?2, ?3, ?4, ?5, ?6, ?6)
                     ON CONFLICT (dedupe_key) DO NOTHING
                     RETURNING id")
        .ctx("preparing a statement")?
        .query_row(params![conversation.0, notice.text, notice.reply_to, notice.dedupe_key, holder.as_str(), now.0],
                    |r| r.get(0),)
                .optional()
                .ctx("queueing a notice")?;
            let _ = conversation;
            Ok(id.map(|id| OutboxRow {
                id: OutboxId(id),
                conversation: notice.conversation,
                kind: OutboxKind::Notice,
                text: notice.text,
                reply_to: notice.reply_to,
                covers: Vec::new(),
                parts_sent: 0,
                attempts: 0,
                created_at: now,
                stored_at: now,
            }))
        })
        .await
    }

    async fn due_outbox(
        &self,
        conversation: ConversationId,
        now: Timestamp,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.with_conn(move |conn| Ok(read_owed(conn, conversation, now)?.rows))
            .await
    }

    async fn mark_sent(
        &self,
        id: OutboxId,
        parts_sent: u32,
        done: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let sent = PartSent {
            outbox: id,
            parts_sent,
            done,
        };
        self.write("marking a reply sent", move |tx| {
            mark_part_sent(tx, sent, now)
        })
        .await
    }

    async fn defer_outbox(
        &self,
        id: OutboxId,
        retry_at: Timestamp,
        error: &str,
    ) -> Result<(), StoreError> {
        let error = error.to_owned();
        self.write("deferring a delivery", move |tx| {
            // No loss: a failed attempt only postpones a row that is still undelivered.
            tx.prepare_cached(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?2, error = ?3
                 WHERE id = ?1 AND sent_at IS NULL AND failed_at IS NULL",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, retry_at.0, error])
            .ctx("deferring a delivery")?;
            Ok(())
        })
        .await
    }

    async fn fail_outbox(
        &self,
        id: OutboxId,
        error: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let error = error.to_owned();
        self.write("giving up a delivery", move |tx| {
            // No duplicate: a row given up is never sent again; a sent row is never
            // marked failed.
            tx.prepare_cached(
                "UPDATE outbox SET attempts = attempts + 1, failed_at = ?2, error = ?3
                 WHERE id = ?1 AND sent_at IS NULL AND failed_at IS NULL",
            )
            .ctx("preparing a statement")?
            .execute(params![id.0, now.0, error])
            .ctx("giving up a delivery")?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl WorkStore for SqliteStore {
    async fn due_work(&self, query: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError> {
        if query.platforms.is_empty() {
            return Ok(DueWork::default());
        }
        let names: Vec<&'static str> = query.platforms.iter().map(|p| p.as_str()).collect();
        let holder = query.holder.as_str().to_owned();
        let handoff = crate::domain::millis(query.handoff);
        let limit = query.limit as i64;
        self.with_conn(move |conn| {
            // Every part is a range scan or a seek on an index over what is due by now
            // (work ready or in progress), never a walk over every conversation or
            // future timer, so a pass costs the same whatever the database holds.
            // Parameters: ?1 now, ?2 (unused), ?3 this holder, ?4 hand-off, ?5… platforms.
            let list = placeholders(5, names.len());
            // Due by now (index timers_due; index outbox_due for outbox heads, rows
            // with no undelivered row before them: delivery keeps outbox order). Work
            // armed or owned by another process is due here a hand-off later: that
            // process is woken in-process, this one takes over only if it does not.
            let candidates = due_candidates_sql(&list);
            let future = next_deadline_sql(&list);
            let mut values: Vec<rusqlite::types::Value> =
                vec![now.0.into(), 0i64.into(), holder.into(), handoff.into()];
            values.extend(
                names
                    .iter()
                    .map(|n| rusqlite::types::Value::from(n.to_string())),
            );
            let mut scan = DueScan::new(now.0);
            {
                let mut stmt = conn.prepare_cached(&candidates).ctx("finding due work")?;
                let mut rows = stmt
                    .query(rusqlite::params_from_iter(values.iter()))
                    .ctx("finding due work")?;
                while let Some(row) = rows.next().ctx("finding due work")? {
                    let conversation = ConversationId(row.get(0).ctx("finding due work")?);
                    let at: i64 = row.get(1).ctx("finding due work")?;
                    let holder: Option<String> = row.get(2).ctx("finding due work")?;
                    let expires_at: Option<i64> = row.get(3).ctx("finding due work")?;
                    scan.candidate(conversation, at, holder.is_some(), expires_at);
                }
            }
            let mut stmt = conn
                .prepare_cached(&future)
                .ctx("finding the next deadline")?;
            if let Some(at) = stmt
                .query_row(rusqlite::params_from_iter(values.iter()), |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .ctx("finding the next deadline")?
            {
                scan.sooner(at);
            }
            let (ready, next_at) = scan.finish(limit as usize);
            Ok(DueWork {
                ready,
                next_at: next_at.map(Timestamp),
            })
        })
        .await
    }

    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError> {
        let conversation = conversation.clone();
        self.with_conn(move |conn| {
            conn.prepare_cached(
                "SELECT c.version = c.answered_version
                        AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.conversation_id = c.id
                                        AND o.sent_at IS NULL AND o.failed_at IS NULL)
                 FROM conversations c WHERE c.platform = ?1 AND c.key = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![conversation.platform.as_str(), conversation.key],
                |r| r.get(0),
            )
            .optional()
            .ctx("checking whether a conversation is settled")
        })
        .await
    }

    async fn pending_conversations(&self) -> Result<u64, StoreError> {
        self.with_conn(|conn| {
            // Kept by triggers on timers: one row, whatever the number of conversations.
            conn.prepare_cached("SELECT pending FROM stats WHERE id = 1")
                .ctx("preparing a statement")?
                .query_row([], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .ctx("counting pending conversations")
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // A read that reaches the file's tables, not just the connection.
        self.with_conn(|conn| {
            conn.prepare_cached(
                "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM conversations LIMIT 1))
                      + (SELECT COUNT(*) FROM (SELECT 1 FROM timers LIMIT 1))",
            )
            .ctx("preparing a statement")?
            .query_row([], |r| r.get::<_, i64>(0))
            .map(drop)
            .ctx("reading the database")
        })
        .await?;
        self.condition.check()
    }

    async fn checkpoint(&self) -> Result<(), StoreError> {
        // Through the writer's queue: after every write queued before it.
        self.writer.checkpoint().await
    }
}

#[async_trait]
impl LimitStore for SqliteStore {
    async fn hold_over_rate(
        &self,
        conversation: ConversationId,
        user_id: &str,
        rate: RateWindow,
        now: Timestamp,
    ) -> Result<Option<RateHold>, StoreError> {
        let user_id = user_id.to_owned();
        self.write("applying the rate limit", move |tx| {
            // Rate limit: the newest message or edit past the limit within the
            // window, if any; the window has room again once it has left.
            let past_limit: Option<i64> = tx
                .prepare_cached("SELECT at FROM (
                         SELECT m.received_at AS at FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.user_id = ?1 AND m.received_at > ?3
                           AND c.platform = (SELECT platform FROM conversations WHERE id = ?2)
                         UNION ALL
                         SELECT e.edited_at FROM edits e
                         WHERE e.user_id = ?1 AND e.edited_at > ?3
                           AND e.platform = (SELECT platform FROM conversations WHERE id = ?2))
                     ORDER BY at DESC LIMIT 1 OFFSET ?4").ctx("preparing a statement")?.query_row(
                    params![user_id, conversation.0, now.0 - crate::domain::millis(rate.window), rate.max],
                    |r| r.get(0),
                )
                .optional()
                .ctx("counting a user's recent messages")?;
            let Some(past_limit) = past_limit else {
                return Ok(None);
            };
            let until = Timestamp(past_limit).plus(rate.window);
            let held: Option<i64> = tx
                .prepare_cached("SELECT held_until FROM timers WHERE conversation_id = ?1").ctx("preparing a statement")?.query_row(
                    [conversation.0],
                    |r| r.get(0),
                )
                .optional()
                .ctx("reading the timer")?;
            match held {
                // Answered already: nothing left to hold.
                None => Ok(None),
                // A hold in force is kept, not extended.
                Some(held_until) if held_until > now.0 => Ok(Some(RateHold {
                    until: Timestamp(held_until),
                    began: false,
                })),
                Some(_) => {
                    hold_timer(tx, conversation, until)?;
                    Ok(Some(RateHold { until, began: true }))
                }
            }
        })
        .await
    }

    async fn charge_tokens(
        &self,
        lease: &Lease,
        charge: &TokenCharge,
        now: Timestamp,
    ) -> Result<Charged, StoreError> {
        let lease = lease.clone();
        let charge = charge.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("charging tokens", move |tx| {
            // Budgets: charged under the lease, fenced like the final check.
            ensure_lease(tx, &lease, &row.resource, now)?;
            let conversation = conversation_of(&lease);
            // One order for every charge (SQLite has one writer; PostgreSQL locks
            // the rows in this order).
            let scopes = super::rules::sorted_scopes(&charge.scopes);
            for scope in &scopes {
                let Some(limit) = scope.limit.filter(|_| scope.tokens > 0) else {
                    continue;
                };
                let used: i64 = tx
                    .prepare_cached("SELECT COALESCE((SELECT tokens FROM token_usage WHERE scope = ?1 AND day = ?2), 0)").ctx("preparing a statement")?.query_row(
                        params![scope.scope, charge.day],
                        |r| r.get(0),
                    )
                    .ctx("reading a token budget")?;
                let used = used.max(0) as u64;
                if used.saturating_add(scope.tokens as u64) > limit {
                    if let Some(until) = charge.hold_until {
                        hold_timer(tx, conversation, until)?;
                    }
                    return Ok(Charged::Over {
                        scope: scope.scope.clone(),
                        used,
                        limit,
                    });
                }
            }
            for scope in &scopes {
                // Budgets: totals are only added to (never written back from a read),
                // so concurrent charges all count; a give-back never goes below zero.
                tx.prepare_cached("INSERT INTO token_usage (scope, day, tokens) VALUES (?1, ?2, CASE WHEN ?3 > 0 THEN ?3 ELSE 0 END)
                     ON CONFLICT (scope, day) DO UPDATE SET tokens =
                         CASE WHEN token_usage.tokens + ?3 > 0 THEN token_usage.tokens + ?3 ELSE 0 END").ctx("preparing a statement")?.execute(
                    params![scope.scope, charge.day, scope.tokens],
                )
                .ctx("charging tokens")?;
            }
            match charge.reservation {
                Reservation::None => {}
                Reservation::Reserve => {
                    // Budgets: every reservation expires: recorded under the lease's
                    // token, it is given back at the next claim unless settled.
                    let mut record = tx
                        .prepare_cached(
                            "INSERT INTO token_reservations (conversation_id, lease_token, day, scope, tokens)
                             VALUES (?1, ?2, ?3, ?4, ?5)
                             ON CONFLICT (conversation_id, lease_token, day, scope)
                             DO UPDATE SET tokens = token_reservations.tokens + excluded.tokens",
                        )
                        .ctx("recording a reservation")?;
                    for scope in &scopes {
                        record
                            .execute(params![
                                conversation.0,
                                lease.token.0,
                                charge.day,
                                scope.scope,
                                scope.tokens
                            ])
                            .ctx("recording a reservation")?;
                    }
                }
                Reservation::Settle => {
                    tx.prepare_cached(
                        "DELETE FROM token_reservations WHERE conversation_id = ?1 AND lease_token = ?2",
                    )
                    .ctx("preparing a statement")?
                    .execute(params![conversation.0, lease.token.0])
                    .ctx("settling a reservation")?;
                }
            }
            Ok(Charged::Charged)
        })
        .await
    }

    async fn token_usage(&self, day: &str, scopes: &[String]) -> Result<Vec<u64>, StoreError> {
        let day = day.to_owned();
        let scopes = scopes.to_vec();
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT tokens FROM token_usage WHERE scope = ?1 AND day = ?2")
                .ctx("reading token usage")?;
            scopes
                .iter()
                .map(|scope| {
                    stmt.query_row(params![scope, day], |r| r.get::<_, i64>(0))
                        .optional()
                        .map(|t| t.unwrap_or(0).max(0) as u64)
                        .ctx("reading token usage")
                })
                .collect()
        })
        .await
    }

    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError> {
        let rule = rule.clone();
        self.write("recording an access decision", move |tx| {
            // One decision per subject: the latest replaces the earlier one.
            tx.prepare_cached("INSERT INTO access_rules (platform, kind, subject, allowed, set_by, set_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (platform, kind, subject) DO UPDATE SET
                     allowed = excluded.allowed, set_by = excluded.set_by, set_at = excluded.set_at").ctx("preparing a statement")?.execute(
                params![
                    rule.subject.platform.as_str(),
                    rule.subject.kind.as_str(),
                    rule.subject.id,
                    rule.allowed,
                    rule.set_by,
                    rule.set_at.0
                ],
            )
            .ctx("recording an access decision")?;
            Ok(())
        })
        .await
    }

    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError> {
        self.with_conn(|conn| read_access_rules(conn)).await
    }
}

/// Hold a conversation's timer: not due before `until` (a later deadline is kept).
/// Give back the reservations of the conversation's earlier leases (rounds abandoned
/// before they settled: a lost lease, a stop, a crash), each on the day it counted
/// for, in the lock order of every charge (day, then scope).
fn give_back_orphans(
    tx: &Connection,
    conversation: ConversationId,
    token: LeaseToken,
) -> Result<(), StoreError> {
    let orphans: Vec<(String, String, i64)> = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT day, scope, SUM(tokens) FROM token_reservations
                 WHERE conversation_id = ?1 AND lease_token < ?2
                 GROUP BY day, scope ORDER BY day, scope",
            )
            .ctx("reading abandoned reservations")?;
        stmt.query_map(params![conversation.0, token.0], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .ctx("reading abandoned reservations")?
        .collect::<Result<_, _>>()
        .ctx("reading abandoned reservations")?
    };
    if orphans.is_empty() {
        return Ok(());
    }
    let mut give_back = tx
        .prepare_cached(
            "UPDATE token_usage SET tokens = CASE WHEN tokens - ?3 > 0 THEN tokens - ?3 ELSE 0 END
             WHERE scope = ?1 AND day = ?2",
        )
        .ctx("giving back a reservation")?;
    for (day, scope, tokens) in &orphans {
        give_back
            .execute(params![scope, day, tokens])
            .ctx("giving back a reservation")?;
    }
    tx.prepare_cached(
        "DELETE FROM token_reservations WHERE conversation_id = ?1 AND lease_token < ?2",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, token.0])
    .ctx("giving back a reservation")?;
    tracing::info!(%conversation, scopes = orphans.len(), "gave back the token reservation of an abandoned round");
    Ok(())
}

fn hold_timer(
    tx: &Connection,
    conversation: ConversationId,
    until: Timestamp,
) -> Result<(), StoreError> {
    // Limits: a held conversation's messages wait (stored, pending) until `until`;
    // later messages, /reset and a forced commit re-arm the timer no sooner.
    tx.prepare_cached(
        "UPDATE timers SET held_until = CASE WHEN held_until < ?2 THEN ?2 ELSE held_until END,
                           due_at = CASE WHEN due_at < ?2 THEN ?2 ELSE due_at END
         WHERE conversation_id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, until.0])
    .ctx("holding a timer")?;
    Ok(())
}

/// Every run-time access decision, oldest first, read on `conn`.
pub(super) fn read_access_rules(conn: &Connection) -> Result<Vec<AccessRule>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT platform, kind, subject, allowed, set_by, set_at FROM access_rules ORDER BY set_at, rowid",
        )
        .ctx("reading access decisions")?;
    let rows: Vec<(String, String, String, bool, String, i64)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .ctx("reading access decisions")?
        .collect::<Result<_, _>>()
        .ctx("reading access decisions")?;
    rows.into_iter()
        .map(|(platform, kind, id, allowed, set_by, set_at)| {
            super::rules::access_rule(&platform, &kind, id, allowed, set_by, set_at)
        })
        .collect()
}

/// The compare-and-swap claim of `row`: succeeds only if the lease is free or expired,
/// and then bumps the fencing token.
fn claim(
    tx: &Connection,
    key: LeaseKey,
    holder: HolderId,
    row: &LeaseRow,
    ttl: Duration,
    now: Timestamp,
) -> Result<Option<Lease>, StoreError> {
    tx.prepare_cached(
        "INSERT INTO leases (resource, conversation_id) VALUES (?1, ?2)
         ON CONFLICT (resource) DO NOTHING",
    )
    .ctx("preparing a statement")?
    .execute(params![row.resource, row.conversation])
    .ctx("creating a lease")?;
    let expires_at = now.plus(ttl);
    // Exclusive: claim only a free or expired lease (compare-and-swap); every claim
    // bumps the fencing token.
    let token: Option<i64> = tx
        .prepare_cached(
            "UPDATE leases SET holder = ?2, token = token + 1, expires_at = ?3
             WHERE resource = ?1 AND (holder IS NULL OR expires_at <= ?4)
             RETURNING token",
        )
        .ctx("preparing a statement")?
        .query_row(
            params![row.resource, holder.as_str(), expires_at.0, now.0],
            |r| r.get(0),
        )
        .optional()
        .ctx("claiming a lease")?;
    Ok(token.map(|token| Lease {
        key,
        holder,
        token: LeaseToken(token),
        expires_at,
    }))
}

/// Record that the first `parts_sent` parts of a row were delivered (and, when
/// `done`, that it is sent). A fact, not a decision: never fenced, never backwards.
fn mark_part_sent(tx: &Connection, sent: PartSent, now: Timestamp) -> Result<(), StoreError> {
    tx.prepare_cached(
        "UPDATE outbox SET
             parts_sent = CASE WHEN parts_sent < ?2 THEN ?2 ELSE parts_sent END,
             sent_at = CASE WHEN ?3 AND sent_at IS NULL THEN ?4 ELSE sent_at END
         WHERE id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![sent.outbox.0, sent.parts_sent, sent.done, now.0])
    .ctx("marking a reply sent")?;
    Ok(())
}

/// The batch of a conversation: version, pending messages, recent history and
/// timer, read on `tx` (one snapshot).
fn read_batch(
    tx: &Connection,
    conversation: ConversationId,
    history: usize,
) -> Result<Batch, StoreError> {
    let row: Option<(String, String, bool, i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT platform, key, is_group, version, answered_version, context_version
             FROM conversations WHERE id = ?1",
        )
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .optional()
        .ctx("reading a conversation")?;
    let Some((platform, key, is_group, version, answered, context_version)) = row else {
        return Err(StoreError::NoConversation(conversation));
    };
    let platform: Platform = platform.parse().map_err(StoreError::Corrupt)?;
    let pending = {
        let mut stmt = tx
            .prepare_cached(
                "SELECT id, platform_message_id, user_id, author, text, version, received_at, media, transcript
                 FROM messages WHERE conversation_id = ?1 AND version > ?2 ORDER BY id",
            )
            .ctx("reading pending messages")?;
        let rows = stmt
            .query_map(params![conversation.0, answered], |r| {
                let media: Option<String> = r.get(7)?;
                let message = PendingMessage {
                    row: r.get(0)?,
                    message_id: r.get(1)?,
                    user_id: r.get(2)?,
                    author: r.get(3)?,
                    text: r.get(4)?,
                    version: Version(r.get(5)?),
                    received_at: Timestamp(r.get(6)?),
                    media: Vec::new(),
                    transcript: r.get(8)?,
                };
                Ok((message, media))
            })
            .ctx("reading pending messages")?
            .collect::<Result<Vec<_>, _>>()
            .ctx("reading pending messages")?;
        rows.into_iter()
            .map(|(message, media)| {
                Ok(PendingMessage {
                    media: super::decode_media(media.as_deref())?,
                    ..message
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?
    };
    let timer = tx
        .prepare_cached("SELECT due_at, attempts FROM timers WHERE conversation_id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| {
            Ok(TimerState {
                due_at: Timestamp(r.get(0)?),
                attempts: r.get(1)?,
            })
        })
        .optional()
        .ctx("reading the timer")?;
    // Nothing to answer (a round that only delivers): no history needed.
    let history = if pending.is_empty() {
        Vec::new()
    } else {
        read_history(tx, conversation, context_version, history)?
    };
    Ok(Batch {
        conversation_id: conversation,
        conversation: ConversationRef::new(platform, key),
        is_group,
        v0: Version(version),
        pending,
        history,
        timer,
    })
}

/// What a conversation's outbox owes now.
struct Owed {
    /// Undelivered rows that are due, oldest first.
    rows: Vec<OutboxRow>,
    /// An undelivered row behind them waits for its retry.
    held_back: bool,
}

/// One conversation's undelivered outbox rows in outbox order: a search of index
/// `outbox_undelivered` (conversation, id; only undelivered rows) for this
/// conversation, then its conversation row by key. Not `outbox_due`: that index
/// orders every conversation's undelivered rows by due time, so reading one
/// conversation through it walks all of them (the due-work query wants it, a claim
/// does not). `INDEXED BY` and `CROSS JOIN` fix that plan (a test checks it).
const READ_OWED_SQL: &str =
    "SELECT o.id, c.platform, c.key, o.kind, o.text, o.reply_to, o.parts_sent,
        o.attempts, o.next_attempt_at, o.created_at
 FROM outbox o INDEXED BY outbox_undelivered CROSS JOIN conversations c ON c.id = o.conversation_id
 WHERE o.conversation_id = ?1 AND o.sent_at IS NULL AND o.failed_at IS NULL
 ORDER BY o.id";

/// A conversation's undelivered outbox rows that are due, oldest first, read on
/// `conn`. Delivery keeps the outbox order: a row waiting for its retry holds back the
/// rows behind it.
fn read_owed(
    conn: &Connection,
    conversation: ConversationId,
    now: Timestamp,
) -> Result<Owed, StoreError> {
    let mut rows = Vec::new();
    let mut held_back = false;
    let mut stmt = conn
        .prepare_cached(READ_OWED_SQL)
        .ctx("reading the outbox")?;
    let mut query = stmt.query([conversation.0]).ctx("reading the outbox")?;
    while let Some(r) = query.next().ctx("reading the outbox")? {
        // Delivery keeps the outbox order: a row waiting for its retry holds
        // back the rows behind it.
        let next_attempt_at: i64 = r.get(8).ctx("reading the outbox")?;
        if next_attempt_at > now.0 {
            held_back = true;
            break;
        }
        let platform: String = r.get(1).ctx("reading the outbox")?;
        let kind: String = r.get(3).ctx("reading the outbox")?;
        rows.push(OutboxRow {
            id: OutboxId(r.get(0).ctx("reading the outbox")?),
            conversation: ConversationRef::new(
                platform.parse().map_err(StoreError::Corrupt)?,
                r.get::<_, String>(2).ctx("reading the outbox")?,
            ),
            kind: if kind == "reply" {
                OutboxKind::Reply
            } else {
                OutboxKind::Notice
            },
            text: r.get(4).ctx("reading the outbox")?,
            reply_to: r.get(5).ctx("reading the outbox")?,
            covers: Vec::new(),
            parts_sent: r.get(6).ctx("reading the outbox")?,
            attempts: r.get(7).ctx("reading the outbox")?,
            created_at: Timestamp(r.get(9).ctx("reading the outbox")?),
            // One host, one clock: the stored time is the caller's.
            stored_at: Timestamp(r.get(9).ctx("reading the outbox")?),
        });
    }
    drop(query);
    let mut covers = conn
        .prepare_cached(
            "SELECT m.platform_message_id FROM reply_covers rc
             JOIN messages m ON m.id = rc.message_id
             WHERE rc.outbox_id = ?1 ORDER BY m.id",
        )
        .ctx("reading covered messages")?;
    for row in &mut rows {
        row.covers = covers
            .query_map([row.id.0], |r| r.get(0))
            .ctx("reading covered messages")?
            .collect::<Result<Vec<String>, _>>()
            .ctx("reading covered messages")?;
    }
    Ok(Owed { rows, held_back })
}

/// The rows among `rows` that still carry a version at or before `v0`: an edit moves a
/// message past `v0`, making it pending again.
fn unchanged_since(tx: &Connection, rows: &[i64], v0: Version) -> Result<Vec<i64>, StoreError> {
    let mut stmt = tx
        .prepare_cached("SELECT version <= ?2 FROM messages WHERE id = ?1")
        .ctx("checking for edits")?;
    let mut unchanged = Vec::with_capacity(rows.len());
    for &row in rows {
        let same: bool = stmt
            .query_row(params![row, v0.0], |r| r.get(0))
            .ctx("checking for edits")?;
        if same {
            unchanged.push(row);
        }
    }
    Ok(unchanged)
}

/// The notices of a reply's held-out messages ([`NewReply::held_out`]), stored in the
/// commit's transaction: each covers its messages still pending up to `v0` (after a
/// forced commit, not those edited since) and not covered yet (no duplicate), so the
/// `answered_version` the commit sets leaves none of them unanswered (no loss).
fn store_held_out(
    tx: &Connection,
    lease: &Lease,
    conversation: &ConversationRef,
    held_out: &[super::HeldOut],
    v0: Version,
    forced: bool,
    now: Timestamp,
) -> Result<Vec<OutboxRow>, StoreError> {
    let id = conversation_of(lease);
    let mut notices = Vec::new();
    for held in held_out {
        let rows = if forced {
            unchanged_since(tx, &held.rows, v0)?
        } else {
            held.rows.clone()
        };
        let mut covered: Vec<(i64, String)> = Vec::new();
        {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT platform_message_id FROM messages m
                     WHERE id = ?1 AND conversation_id = ?2
                       AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)",
                )
                .ctx("reading held-out messages")?;
            for row in rows {
                if let Some(message_id) = stmt
                    .query_row(params![row, id.0], |r| r.get::<_, String>(0))
                    .optional()
                    .ctx("reading held-out messages")?
                {
                    covered.push((row, message_id));
                }
            }
        }
        if covered.is_empty() {
            continue;
        }
        let outbox: i64 = tx
            .prepare_cached(
                "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                     owner, created_at, next_attempt_at)
                 VALUES (?1, 'notice', ?2, ?3, ?4, ?5, ?6, ?7, ?7)
                 RETURNING id",
            )
            .ctx("preparing a statement")?
            .query_row(
                params![
                    id.0,
                    &held.text,
                    held.reply_to,
                    v0.0,
                    lease.token.0,
                    lease.holder.as_str(),
                    now.0
                ],
                |r| r.get(0),
            )
            .ctx("storing a held-out notice")?;
        let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
        record_covers(tx, outbox, &rows)?;
        notices.push(OutboxRow {
            id: OutboxId(outbox),
            conversation: conversation.clone(),
            kind: OutboxKind::Notice,
            text: held.text.clone(),
            reply_to: held.reply_to.clone(),
            covers: covered.into_iter().map(|(_, id)| id).collect(),
            parts_sent: 0,
            attempts: 0,
            created_at: now,
            stored_at: now,
        });
    }
    Ok(notices)
}

/// Record which messages an outbox row (a reply, or a give-up notice) answers.
fn record_covers(tx: &Connection, outbox: i64, messages: &[i64]) -> Result<(), StoreError> {
    let mut cover = tx
        .prepare_cached("INSERT INTO reply_covers (outbox_id, message_id) VALUES (?1, ?2)")
        .ctx("recording covered messages")?;
    for message in messages {
        cover
            .execute(params![outbox, message])
            .ctx("recording covered messages")?;
    }
    Ok(())
}

/// Mark everything up to `v0` answered, after a reply or a give-up was stored in the
/// same transaction: the timer goes unless a newer message armed it, and then it is
/// re-armed for the messages still pending.
fn answer_through(
    tx: &Connection,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    // The answered version only grows.
    tx.prepare_cached(
        "UPDATE conversations SET answered_version = ?2 WHERE id = ?1 AND answered_version < ?2",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, v0.0])
    .ctx("marking the batch answered")?;
    // The timer goes only if nothing newer than v0 armed it.
    let deleted = tx
        .prepare_cached("DELETE FROM timers WHERE conversation_id = ?1 AND armed_version <= ?2")
        .ctx("preparing a statement")?
        .execute(params![conversation.0, v0.0])
        .ctx("deleting the timer")?;
    if deleted == 0 {
        rearm_for_remaining(tx, conversation, v0, policy)?;
    }
    Ok(())
}

/// After a forced commit, messages newer than `v0` are still pending: their timer
/// stays, and its cap now counts from the oldest of them, not from the burst just
/// answered.
fn rearm_for_remaining(
    tx: &Connection,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    let (pending, first_pending) = pending_after(tx, conversation, v0.0)?;
    let Some(first_pending) = first_pending else {
        return Ok(());
    };
    let armed_at: Option<i64> = tx
        .prepare_cached("SELECT armed_at FROM timers WHERE conversation_id = ?1")
        .ctx("preparing a statement")?
        .query_row([conversation.0], |r| r.get(0))
        .optional()
        .ctx("reading the timer")?;
    let Some(armed_at) = armed_at else {
        return Ok(());
    };
    let due_at = policy.due_at(Timestamp(armed_at), first_pending, pending);
    tx.prepare_cached(
        "UPDATE timers SET due_at = MAX(?2, held_until), attempts = 0, retry_at = 0 WHERE conversation_id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, due_at.0])
    .ctx("re-arming the timer")?;
    Ok(())
}

/// The last `limit` replies since the context was reset, with the messages each
/// covered, oldest first. Dropped (stale) replies were never stored, so they never
/// appear here.
fn read_history(
    tx: &Connection,
    conversation: ConversationId,
    context_version: i64,
    limit: usize,
) -> Result<Vec<Exchange>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    // The last `limit` replies with the messages each covered, in one query.
    let mut stmt = tx
        .prepare_cached(
            "SELECT o.id, o.text, m.author, m.text, m.transcript
             FROM (SELECT id, text FROM outbox
                   WHERE conversation_id = ?1 AND kind = 'reply' AND failed_at IS NULL AND version > ?2
                   ORDER BY id DESC LIMIT ?3) o
             JOIN reply_covers rc ON rc.outbox_id = o.id
             JOIN messages m ON m.id = rc.message_id
             ORDER BY o.id, m.id",
        )
        .ctx("reading history")?;
    let mut rows = stmt
        .query(params![conversation.0, context_version, limit as i64])
        .ctx("reading history")?;
    let mut read = Vec::new();
    while let Some(row) = rows.next().ctx("reading history")? {
        let text: String = row.get(3).ctx("reading history")?;
        let transcript: Option<String> = row.get(4).ctx("reading history")?;
        let said = Said {
            author: row.get(2).ctx("reading history")?,
            text: super::said_text(&text, transcript.as_deref()),
        };
        read.push((
            row.get(0).ctx("reading history")?,
            row.get(1).ctx("reading history")?,
            said,
        ));
    }
    Ok(super::rules::exchanges(read))
}

#[cfg(test)]
mod tests {
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

    /// The scheduler's queries read what is due, never every conversation or timer:
    /// each table they name is reached by a search on an index (a `SCAN` is allowed
    /// only over their own small intermediate results), so an idle pass costs the same
    /// with ten thousand conversations as with none.
    #[test]
    fn due_work_searches_indexes_and_walks_no_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.db");
        let policy = TimerPolicy::new(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(4),
            4,
        )
        .unwrap();
        drop(SqliteStore::open(&path, policy).unwrap());
        let conn = Connection::open(&path).unwrap();
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
}
