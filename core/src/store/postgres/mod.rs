//! The PostgreSQL backend: one database shared by lull replicas on several hosts.
//!
//! # Clock
//! Replicas on several hosts do not share a clock, so in production (`TimeSource::
//! Database`) every deadline is read and compared on the database's clock
//! (`clock_timestamp()`): a lease is claimed, checked and renewed against it inside
//! the statement that decides, timers are armed and found due on it. The caller's
//! `now` only translates the times it passes in (a retry deadline) and gets back (a
//! timer's `due_at`, the next deadline) between its own timeline and the database's,
//! so a skewed host wakes on time and never takes a timer early. Times handed back
//! (a timer's due time, the next deadline, an outbox row's creation) are on the
//! caller's timeline; times stored and compared are the database's. The conformance
//! checks drive time themselves (`TimeSource::Caller`): the caller's `now` is the clock.
//!
//! # Isolation, per method
//! Every write runs at READ COMMITTED with row locks where a read decides a write, in
//! one lock order (lease row, then conversation row, then timer row), so transactions
//! queue instead of deadlocking:
//! - `ingest`, `edit`, `enqueue_notice`, `reset_context` lock the conversation row
//!   first (the upsert's `ON CONFLICT DO UPDATE`, or `FOR UPDATE`): the version bump,
//!   the pending count and the timer arm are then decided with no other writer of the
//!   conversation in between.
//! - `claim_lease`, `claim_round`: the compare-and-swap `UPDATE … RETURNING token`
//!   waits for a concurrent claim and re-checks its condition on the row that claim
//!   left (PostgreSQL re-evaluates an UPDATE's WHERE after a lock wait), so two
//!   claimers never both win. `claim_round` then reads the batch under a `FOR SHARE`
//!   lock of the conversation row: no ingest commits while it reads, so version,
//!   pending messages and timer agree.
//! - `commit_reply`, `give_up`, `disarm_idle_timer`, `record_failure`: the lease row
//!   `FOR UPDATE` with the holder, token and expiry check (fencing: no claim can take
//!   the lease over until this transaction ends), then the conversation row
//!   `FOR UPDATE` (the final check reads a version no ingest can change before the
//!   commit).
//! - `charge_tokens`: the lease row `FOR UPDATE` (fencing), then every budget row of
//!   the charge `FOR UPDATE` in one order (scope names sorted once, each once) before
//!   any is written; `claim_round` gives abandoned reservations back in the same
//!   order (day, then scope). Charges on the same budgets queue, never deadlock.
//! - `renew_lease`, `release_lease`, `mark_sent`, `defer_outbox`, `fail_outbox`: one
//!   conditional UPDATE each, atomic on its row.
//! - `collect`, `due_work` and the other reads: READ COMMITTED reads (`collect` under
//!   the same `FOR SHARE` lock as `claim_round`); `due_work` only proposes work, the
//!   claim decides.
//!
//! A serialization failure, a deadlock or a lock wait past the statement timeout is
//! [`StoreError::Busy`] and the transaction is retried a few times; a lost connection
//! is [`StoreError::Pool`] (transient: the dispatcher tries again, nothing is lost,
//! and an ingest it was unsure of is idempotent on the platform message id).
//!
//! # Wake-ups
//! Arming a timer sends `NOTIFY lull_armed` in the ingest transaction (delivered only
//! if it commits); each process keeps one `LISTEN` connection (reconnected after a
//! drop) that wakes its scheduler, so a replica learns of work armed elsewhere at once
//! and the poll stays a safety net.

mod listen;
pub(crate) mod schema;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use lull_port::retry::Backoff;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, Row};

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
use crate::clock::{Clock, SystemClock};
use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, LeaseToken, OutboxId, Platform,
    Said, Timestamp, Version,
};
use crate::timing::TimerPolicy;

/// Connections per process: rounds mostly wait on the model, not the database.
const POOL_SIZE: usize = 8;
/// How long a statement may wait for a row lock (or run) before it is cancelled and
/// reported as [`StoreError::Busy`], like SQLite's busy timeout.
const STATEMENT_TIMEOUT_MS: u64 = 5000;
/// How often a transaction that hit a serialization failure or deadlock is retried.
const RETRIES: u32 = 4;
/// The client-side deadline of one try of a store call: the pooled connection, every
/// statement and the commit. Longer than the server's statement timeout, so a lock
/// wait is reported by the server first ([`StoreError::Busy`]); a connection whose
/// path went silent (no reset: a frozen network, a host gone) fails after it as
/// [`StoreError::Pool`] instead of hanging until the kernel gives the socket up, and
/// the connection is dropped from the pool rather than handed out again.
const CALL_DEADLINE: Duration = Duration::from_millis(2 * STATEMENT_TIMEOUT_MS);
/// TCP keepalive on every connection: an idle connection whose peer is gone is found
/// (and closed, so the pool replaces it) after about idle + interval × retries,
/// instead of the kernel's two hours.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: sent data left unacknowledged this long closes the connection
/// (Linux), the kernel's own bound on a dead path while a statement waits.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);
/// The channel timers are announced on.
const CHANNEL: &str = "lull_armed";

/// The database's clock in milliseconds since the Unix epoch, as SQL.
macro_rules! db_now {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::int8"
    };
}

/// Whose clock decides deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// Production: the database's clock, the one clock every replica shares.
    Database,
    /// Tests that drive time: the `now` each call is given.
    Caller,
}

/// The current time of one transaction, and how to move times between the caller's
/// timeline and the database's.
#[derive(Debug, Clone, Copy)]
struct Now {
    /// The time deadlines are stored and compared in.
    db: Timestamp,
    /// The database's clock minus the caller's (0 when the caller is the clock).
    offset: i64,
    /// The caller's `now` when the caller is the clock: what the lease statements
    /// compare with instead of `clock_timestamp()`.
    fixed: Option<i64>,
}

impl Now {
    /// A time of the caller's (a retry deadline) on the database's timeline.
    fn to_db(self, t: Timestamp) -> Timestamp {
        Timestamp(t.0.saturating_add(self.offset))
    }

    /// A time of the database's (a timer's due time) on the caller's timeline.
    fn to_caller(self, t: Timestamp) -> Timestamp {
        Timestamp(t.0.saturating_sub(self.offset))
    }
}

/// A [`Store`](super::Store) on a PostgreSQL database.
pub struct PostgresStore {
    pool: Pool,
    /// The URL with its password hidden, for messages.
    shown: String,
    timers: TimerPolicy,
    time: TimeSource,
    lease_rows: LeaseRows,
    #[cfg(feature = "test-switches")]
    faults: Arc<FaultPlan>,
    condition: Arc<Condition>,
    /// Woken when another process (or this one) arms a timer.
    armed: Arc<tokio::sync::Notify>,
    /// The LISTEN connection's task, stopped with the store.
    _listener: Arc<listen::Listener>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .field("time", &self.time)
            .finish()
    }
}

/// What [`PostgresStore::inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresInspection {
    /// The schema version (0: no lull schema yet; `lull run` creates it).
    pub schema: i64,
    /// This build's schema version.
    pub latest: i64,
    /// The server's version string.
    pub server: String,
    /// The admins' run-time access decisions (`/allow`, `/deny`), oldest first.
    pub access: Vec<AccessRule>,
}

/// The connection settings of `url` (`postgres://` or `postgresql://`, with `sslmode`
/// `disable`, `prefer` (the default) or `require`), with lull's statement timeout,
/// TCP keepalives and TCP user timeout.
fn config(url: &str) -> Result<tokio_postgres::Config, String> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| e.to_string())?;
    let options = match config.get_options() {
        Some(given) => format!("{given} -c statement_timeout={STATEMENT_TIMEOUT_MS}"),
        None => format!("-c statement_timeout={STATEMENT_TIMEOUT_MS}"),
    };
    config.options(options);
    if config.get_application_name().is_none() {
        config.application_name("lull");
    }
    // A dead peer or path is noticed by the kernel, not only by the call deadline
    // (settings given in the URL win).
    config.keepalives(true);
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    Ok(config)
}

/// TLS by rustls: the platform's root certificates, or webpki's when it has none.
fn tls() -> tokio_postgres_rustls::MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

/// Attaches what we were doing to a PostgreSQL error and sorts out the conditions a
/// caller can wait out from real failures.
trait Context<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, tokio_postgres::Error> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| classify(context, &source))
    }
}

/// A backend-neutral [`StoreError`] for a PostgreSQL error.
fn classify(context: &'static str, source: &tokio_postgres::Error) -> StoreError {
    let Some(code) = source.code() else {
        // No SQLSTATE: the connection broke (refused, reset, closed) or timed out.
        return StoreError::Pool(format!(
            "lost the database connection while {context}: {source}"
        ));
    };
    let detail = || match source.as_db_error() {
        Some(db) => format!("{}, while {context}", db.message()),
        None => format!("{source}, while {context}"),
    };
    match *code {
        SqlState::T_R_SERIALIZATION_FAILURE
        | SqlState::T_R_DEADLOCK_DETECTED
        | SqlState::LOCK_NOT_AVAILABLE
        | SqlState::QUERY_CANCELED => StoreError::Busy,
        SqlState::DISK_FULL | SqlState::PROGRAM_LIMIT_EXCEEDED => StoreError::Full,
        SqlState::ADMIN_SHUTDOWN
        | SqlState::CRASH_SHUTDOWN
        | SqlState::CANNOT_CONNECT_NOW
        | SqlState::TOO_MANY_CONNECTIONS
        | SqlState::OUT_OF_MEMORY
        | SqlState::CONNECTION_FAILURE
        | SqlState::CONNECTION_EXCEPTION => StoreError::Pool(detail()),
        SqlState::DATA_CORRUPTED | SqlState::INDEX_CORRUPTED => StoreError::Damaged(detail()),
        SqlState::IO_ERROR
        | SqlState::READ_ONLY_SQL_TRANSACTION
        | SqlState::INSUFFICIENT_PRIVILEGE => StoreError::Io(detail()),
        _ => StoreError::Backend {
            context,
            message: detail(),
        },
    }
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

async fn query(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Vec<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query(&statement, params).await.ctx(context)
}

async fn query_opt(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Option<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_opt(&statement, params).await.ctx(context)
}

async fn query_one(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Row, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_one(&statement, params).await.ctx(context)
}

async fn execute(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<u64, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.execute(&statement, params).await.ctx(context)
}

/// Run `$body` (an expression of type `Result<T, StoreError>` using `$tx`) in one
/// READ COMMITTED transaction, committed when it is `Ok`, rolled back when it is
/// `Err`; retried from the start after a serialization failure or deadlock. The one
/// place a transaction reaches the database, where a test's fault plan is consulted
/// and the store's condition learns the outcome. A macro, not a function taking a
/// closure: the body borrows the transaction across awaits.
/// Between tries of a transaction that met a serialization failure or deadlock.
const SERIALIZATION_RETRY: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(80));

macro_rules! transaction {
    ($store:expr, $operation:expr, $context:expr, |$tx:ident| $body:expr) => {{
        let store: &PostgresStore = $store;
        let mut attempt = 0;
        let started = std::time::Instant::now();
        let result = loop {
            // No call hangs: the pooled connection, the statements and the commit
            // answer by the deadline, or the call fails (a transient error).
            let deadline = tokio::time::Instant::now() + CALL_DEADLINE;
            let late = || {
                StoreError::Pool(format!(
                    "no answer from the database within {} ms while {}",
                    CALL_DEADLINE.as_millis(),
                    $context
                ))
            };
            let result = async {
                store.before_write($operation)?;
                let mut client = tokio::time::timeout_at(deadline, store.client())
                    .await
                    .map_err(|_| late())??;
                let tried = tokio::time::timeout_at(deadline, async {
                    let $tx = client
                        .build_transaction()
                        .isolation_level(IsolationLevel::ReadCommitted)
                        .start()
                        .await
                        .ctx($context)?;
                    let value = $body?;
                    $tx.commit().await.ctx($context)?;
                    Ok(value)
                })
                .await;
                match tried {
                    Ok(done) => done,
                    Err(_) => {
                        // Its socket may be dead: not back into the pool. The caller
                        // hears a transient error, as when the server drops the
                        // connection mid-call (a write may then have committed).
                        drop(deadpool_postgres::Object::take(client));
                        Err(late())
                    }
                }
            }
            .await;
            match result {
                // A serialization failure or deadlock comes at once and is worth
                // another try; a lock wait that ran into the statement timeout has
                // waited long enough, and the caller is told.
                Err(StoreError::Busy)
                    if attempt < RETRIES
                        && started.elapsed() < Duration::from_millis(STATEMENT_TIMEOUT_MS) =>
                {
                    attempt += 1;
                    tokio::time::sleep(SERIALIZATION_RETRY.delay(attempt)).await;
                }
                other => break other,
            }
        };
        store
            .condition
            .observe(&result, $operation != Operation::Read);
        result
    }};
}

impl PostgresStore {
    /// Connect to the database at `url` and bring its schema up to date (safe when
    /// several replicas start at once); timers are armed by `timers`, deadlines are
    /// read on the clock `time` names (production: [`TimeSource::Database`]).
    pub async fn open(
        url: &str,
        timers: TimerPolicy,
        time: TimeSource,
    ) -> Result<Self, StoreError> {
        let shown = lull_port::secrets::redact_url(url);
        let open_error = |reason: String| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        let config = config(url).map_err(open_error)?;
        let tls = tls();
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| open_error(e.to_string()))?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| open_error(format!("cannot connect: {}", pool_reason(&e))))?;
        let schema = schema::migrate(&mut client)
            .await
            .map_err(|e| open_error(format!("schema migration failed: {}", describe(&e))))?;
        if schema > schema::LATEST {
            return Err(open_error(format!(
                "the schema is at version {schema}, newer than this lull knows ({}): run the newer lull",
                schema::LATEST
            )));
        }
        drop(client);
        let armed = Arc::new(tokio::sync::Notify::new());
        let listener = Arc::new(listen::Listener::start(config, tls, CHANNEL, armed.clone()));
        Ok(Self {
            pool,
            shown,
            timers,
            time,
            lease_rows: LeaseRows::Shared,
            #[cfg(feature = "test-switches")]
            faults: Arc::default(),
            condition: Arc::default(),
            armed,
            _listener: listener,
        })
    }

    /// Look at the database at `url` without changing it (for `lull check`): connect,
    /// read the schema version; nothing is created or migrated.
    pub async fn inspect(url: &str) -> Result<PostgresInspection, StoreError> {
        let shown = lull_port::secrets::redact_url(url);
        let open_error = |reason: String| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        let config = config(url).map_err(open_error)?;
        let (client, connection) =
            tokio::time::timeout(Duration::from_secs(10), config.connect(tls()))
                .await
                .map_err(|_| open_error("no answer within 10 s".into()))?
                .map_err(|e| open_error(format!("cannot connect: {}", describe(&e))))?;
        let driver = tokio::spawn(connection);
        let found = async {
            // Read-only: this session cannot create or change anything.
            client
                .batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
                .await?;
            let schema = schema::version(&client).await?;
            let server: String = client.query_one("SHOW server_version", &[]).await?.get(0);
            let access = if schema >= 2 {
                client.query(ACCESS_RULES, &[]).await?
            } else {
                Vec::new()
            };
            Ok::<_, tokio_postgres::Error>((schema, server, access))
        }
        .await;
        drop(client);
        driver.abort();
        let (schema, server, access) = found.map_err(|e| open_error(describe(&e)))?;
        let access = access_rules_of(access).map_err(|e| open_error(e.to_string()))?;
        if schema > schema::LATEST {
            return Err(open_error(format!(
                "the schema is at version {schema}, newer than this lull knows ({}): run the newer lull",
                schema::LATEST
            )));
        }
        Ok(PostgresInspection {
            schema,
            latest: schema::LATEST,
            server,
            access,
        })
    }

    /// The counter-test's switch: the same store and the same SQL, but every holder
    /// gets a private row for each lease (see `LeaseRows`). Exists only in builds with
    /// the `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub fn without_lease_checks(mut self) -> Self {
        self.lease_rows = LeaseRows::PerHolder;
        self
    }

    /// The same store, consulting `plan` where its writes reach the database. Exists
    /// only in builds with the `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub fn with_faults(mut self, plan: Arc<FaultPlan>) -> Self {
        self.faults = plan;
        self
    }

    #[cfg_attr(not(feature = "test-switches"), allow(unused_variables))]
    fn before_write(&self, operation: Operation) -> Result<(), StoreError> {
        #[cfg(feature = "test-switches")]
        self.faults.before_write(operation)?;
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Pool(pool_reason(&e)))
    }

    /// The current time of the transaction `tx`: the database's clock, or the
    /// caller's `caller` when the caller drives time.
    async fn now(&self, tx: &Tx<'_>, caller: Timestamp) -> Result<Now, StoreError> {
        match self.time {
            TimeSource::Caller => Ok(Now {
                db: caller,
                offset: 0,
                fixed: Some(caller.0),
            }),
            TimeSource::Database => {
                let db: i64 = query_one(
                    tx,
                    concat!("SELECT ", db_now!()),
                    &[],
                    "reading the database's clock",
                )
                .await?
                .get(0);
                Ok(Now {
                    db: Timestamp(db),
                    offset: db - caller.0,
                    fixed: None,
                })
            }
        }
    }

    fn row(&self, key: &LeaseKey, holder: &HolderId) -> LeaseRow {
        self.lease_rows.row(key, holder)
    }
}

fn pool_reason(error: &deadpool_postgres::PoolError) -> String {
    match error {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    }
}

/// A PostgreSQL error in words: the server's message when it sent one.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// Find or create a conversation row and lock it for the rest of the transaction
/// (the upsert's `DO UPDATE` locks the row): every writer of a conversation queues
/// here. A group stays a group.
async fn upsert_conversation(
    tx: &Tx<'_>,
    conversation: &ConversationRef,
    is_group: bool,
    now: Timestamp,
) -> Result<ConversationId, StoreError> {
    let row = query_one(
        tx,
        "INSERT INTO conversations (platform, key, is_group, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (platform, key) DO UPDATE SET is_group = conversations.is_group OR excluded.is_group
         RETURNING id",
        &[&conversation.platform.as_str(), &conversation.key, &is_group, &now.0],
        "finding a conversation",
    )
    .await?;
    Ok(ConversationId(row.get(0)))
}

/// How many messages are pending after `answered` and when the oldest arrived.
async fn pending_after(
    tx: &Tx<'_>,
    conversation: ConversationId,
    answered: i64,
) -> Result<(u32, Option<Timestamp>), StoreError> {
    let row = query_one(
        tx,
        "SELECT COUNT(*), MIN(received_at) FROM messages WHERE conversation_id = $1 AND version > $2",
        &[&conversation.0, &answered],
        "counting pending messages",
    )
    .await?;
    Ok((
        row.get::<_, i64>(0) as u32,
        row.get::<_, Option<i64>>(1).map(Timestamp),
    ))
}

/// Bump the version of a conversation that just got a message (or an edit), arm its
/// timer and announce it. Must run in the transaction that stored the message, with
/// the conversation row locked.
async fn bump_and_arm(
    tx: &Tx<'_>,
    conversation: ConversationId,
    platform: Platform,
    policy: TimerPolicy,
    holder: &HolderId,
    now: Timestamp,
) -> Result<(Version, Timestamp), StoreError> {
    // Version counter: bumped in the same transaction that stores the message.
    let row = query_one(
        tx,
        "UPDATE conversations SET version = version + 1 WHERE id = $1 RETURNING version, answered_version",
        &[&conversation.0],
        "bumping the version",
    )
    .await?;
    let (version, answered): (i64, i64) = (row.get(0), row.get(1));
    let (pending, first_pending) = pending_after(tx, conversation, answered).await?;
    let due_at = policy.due_at(now, first_pending.unwrap_or(now), pending);
    // Capped debounce: every message re-arms the timer, never past the cap, and never
    // sooner than a failed generation's backoff (`retry_at`).
    let row = query_one(
        tx,
        "INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (conversation_id) DO UPDATE SET
             due_at = GREATEST(excluded.due_at, timers.retry_at, timers.held_until),
             armed_version = excluded.armed_version,
             armed_at = excluded.armed_at,
             armed_by = excluded.armed_by
         RETURNING due_at",
        &[
            &conversation.0,
            &platform.as_str(),
            &due_at.0,
            &version,
            &now.0,
            &holder.as_str(),
        ],
        "arming the timer",
    )
    .await?;
    // Wake-ups: sent at commit, so only a timer that exists wakes other replicas.
    query(
        tx,
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &platform.as_str()],
        "announcing the timer",
    )
    .await?;
    Ok((Version(version), Timestamp(row.get(0))))
}

/// Exclusive: a write under a lease needs the live holder with the current token in
/// the lease's row, checked on the database's clock; the row stays locked until the
/// transaction ends, so no claim takes the lease over before this write commits.
async fn ensure_lease(
    tx: &Tx<'_>,
    lease: &Lease,
    row: &LeaseRow,
    now: Now,
) -> Result<(), StoreError> {
    // Fencing: holder, token and expiry, locked for the rest of the transaction.
    let ours = query_opt(
        tx,
        concat!(
            "SELECT 1 FROM leases WHERE resource = $1 AND holder = $2 AND token = $3
               AND expires_at > COALESCE($4::int8, ",
            db_now!(),
            ") FOR UPDATE"
        ),
        &[
            &row.resource,
            &lease.holder.as_str(),
            &lease.token.0,
            &now.fixed,
        ],
        "checking the lease",
    )
    .await?;
    match ours {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseLost(lease.key.clone())),
    }
}

/// Lock a conversation row for the rest of the transaction (after its lease row, in
/// the one lock order), returning its version.
async fn lock_conversation(tx: &Tx<'_>, conversation: ConversationId) -> Result<i64, StoreError> {
    let row = query_opt(
        tx,
        "SELECT version FROM conversations WHERE id = $1 FOR UPDATE",
        &[&conversation.0],
        "reading the version",
    )
    .await?;
    row.map(|r| r.get(0))
        .ok_or(StoreError::NoConversation(conversation))
}

/// The compare-and-swap claim of `row`, on the database's clock: succeeds only if the
/// lease is free or expired, and then bumps the fencing token.
async fn claim(
    tx: &Tx<'_>,
    key: LeaseKey,
    holder: HolderId,
    row: &LeaseRow,
    ttl: Duration,
    now: Now,
) -> Result<Option<Lease>, StoreError> {
    execute(
        tx,
        "INSERT INTO leases (resource, conversation_id) VALUES ($1, $2) ON CONFLICT (resource) DO NOTHING",
        &[&row.resource, &row.conversation],
        "creating a lease",
    )
    .await?;
    let ttl = crate::domain::millis(ttl);
    // Exclusive: claim only a free or expired lease (compare-and-swap); every claim
    // bumps the fencing token. After waiting for a concurrent claim, PostgreSQL
    // re-checks this condition on the row that claim left.
    let claimed = query_opt(
        tx,
        concat!(
            "WITH clock AS (SELECT COALESCE($4::int8, ", db_now!(), ") AS t)
             UPDATE leases SET holder = $2, token = token + 1, expires_at = (SELECT t FROM clock) + $3
             WHERE resource = $1 AND (holder IS NULL OR expires_at <= (SELECT t FROM clock))
             RETURNING token, expires_at"
        ),
        &[&row.resource, &holder.as_str(), &ttl, &now.fixed],
        "claiming a lease",
    )
    .await?;
    Ok(claimed.map(|r| Lease {
        key,
        holder,
        token: LeaseToken(r.get(0)),
        expires_at: Timestamp(r.get(1)),
    }))
}

/// Record that the first `parts_sent` parts of a row were delivered (and, when
/// `done`, that it is sent). A fact, not a decision: never fenced, never backwards.
async fn mark_part_sent(tx: &Tx<'_>, sent: PartSent, now: Timestamp) -> Result<(), StoreError> {
    execute(
        tx,
        "UPDATE outbox SET
             parts_sent = GREATEST(parts_sent, $2),
             sent_at = CASE WHEN $3 AND sent_at IS NULL THEN $4 ELSE sent_at END
         WHERE id = $1",
        &[
            &sent.outbox.0,
            &(sent.parts_sent as i32),
            &sent.done,
            &now.0,
        ],
        "marking a reply sent",
    )
    .await?;
    Ok(())
}

/// The batch of a conversation: version, pending messages, recent history and timer,
/// read under a `FOR SHARE` lock of the conversation row, so no ingest commits between
/// the reads and they agree.
async fn read_batch(
    tx: &Tx<'_>,
    conversation: ConversationId,
    history: usize,
) -> Result<Batch, StoreError> {
    let row = query_opt(
        tx,
        "SELECT platform, key, is_group, version, answered_version, context_version
         FROM conversations WHERE id = $1 FOR SHARE",
        &[&conversation.0],
        "reading a conversation",
    )
    .await?;
    let Some(row) = row else {
        return Err(StoreError::NoConversation(conversation));
    };
    let platform: Platform = row
        .get::<_, String>(0)
        .parse()
        .map_err(StoreError::Corrupt)?;
    let (key, is_group, version, answered, context_version): (String, bool, i64, i64, i64) =
        (row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
    let pending = query(
        tx,
        "SELECT id, platform_message_id, user_id, author, text, version, received_at, media, transcript
         FROM messages WHERE conversation_id = $1 AND version > $2 ORDER BY id",
        &[&conversation.0, &answered],
        "reading pending messages",
    )
    .await?
    .into_iter()
    .map(|r| {
        Ok(PendingMessage {
            row: r.get(0),
            message_id: r.get(1),
            user_id: r.get(2),
            author: r.get(3),
            text: r.get(4),
            version: Version(r.get(5)),
            received_at: Timestamp(r.get(6)),
            media: super::decode_media(r.get(7))?,
            transcript: r.get(8),
        })
    })
    .collect::<Result<Vec<_>, StoreError>>()?;
    let timer = query_opt(
        tx,
        "SELECT due_at, attempts FROM timers WHERE conversation_id = $1",
        &[&conversation.0],
        "reading the timer",
    )
    .await?
    .map(|r| TimerState {
        due_at: Timestamp(r.get(0)),
        attempts: r.get::<_, i32>(1) as u32,
    });
    // Nothing to answer (a round that only delivers): no history needed.
    let history = if pending.is_empty() {
        Vec::new()
    } else {
        read_history(tx, conversation, context_version, history).await?
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

/// A conversation's undelivered outbox rows that are due, oldest first, and whether a
/// row behind them waits for its retry (delivery keeps the outbox order).
async fn read_owed(
    tx: &Tx<'_>,
    conversation: ConversationId,
    now: Timestamp,
) -> Result<(Vec<OutboxRow>, bool), StoreError> {
    let found = query(
        tx,
        "SELECT o.id, c.platform, c.key, o.kind, o.text, o.reply_to, o.parts_sent,
                o.attempts, o.next_attempt_at, o.created_at
         FROM outbox o JOIN conversations c ON c.id = o.conversation_id
         WHERE o.conversation_id = $1 AND o.sent_at IS NULL AND o.failed_at IS NULL
         ORDER BY o.id",
        &[&conversation.0],
        "reading the outbox",
    )
    .await?;
    let mut rows = Vec::new();
    let mut held_back = false;
    for r in found {
        // Delivery keeps the outbox order: a row waiting for its retry holds back the
        // rows behind it.
        if r.get::<_, i64>(8) > now.0 {
            held_back = true;
            break;
        }
        let platform: String = r.get(1);
        rows.push(OutboxRow {
            id: OutboxId(r.get(0)),
            conversation: ConversationRef::new(
                platform.parse().map_err(StoreError::Corrupt)?,
                r.get::<_, String>(2),
            ),
            kind: if r.get::<_, &str>(3) == "reply" {
                OutboxKind::Reply
            } else {
                OutboxKind::Notice
            },
            text: r.get(4),
            reply_to: r.get(5),
            covers: Vec::new(),
            parts_sent: r.get::<_, i32>(6) as u32,
            attempts: r.get::<_, i32>(7) as u32,
            created_at: Timestamp(r.get(9)),
            stored_at: Timestamp(r.get(9)),
        });
    }
    for row in &mut rows {
        row.covers = query(
            tx,
            "SELECT m.platform_message_id FROM reply_covers rc JOIN messages m ON m.id = rc.message_id
             WHERE rc.outbox_id = $1 ORDER BY m.id",
            &[&row.id.0],
            "reading covered messages",
        )
        .await?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    }
    Ok((rows, held_back))
}

/// The last `limit` replies since the context was reset, with the messages each
/// covered, oldest first.
async fn read_history(
    tx: &Tx<'_>,
    conversation: ConversationId,
    context_version: i64,
    limit: usize,
) -> Result<Vec<Exchange>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let rows = query(
        tx,
        "SELECT o.id, o.text, m.author, m.text, m.transcript
         FROM (SELECT id, text FROM outbox
               WHERE conversation_id = $1 AND kind = 'reply' AND failed_at IS NULL AND version > $2
               ORDER BY id DESC LIMIT $3) o
         JOIN reply_covers rc ON rc.outbox_id = o.id
         JOIN messages m ON m.id = rc.message_id
         ORDER BY o.id, m.id",
        &[&conversation.0, &context_version, &(limit as i64)],
        "reading history",
    )
    .await?;
    Ok(super::rules::exchanges(rows.into_iter().map(|row| {
        let said = Said {
            author: row.get(2),
            text: super::said_text(row.get(3), row.get(4)),
        };
        (row.get(0), row.get(1), said)
    })))
}

/// Record which messages an outbox row (a reply, or a give-up notice) answers.
/// The notices of a reply's held-out messages ([`NewReply::held_out`]), stored in the
/// commit's transaction: each covers its messages still pending up to `v0` (after a
/// forced commit, not those edited since) and not covered yet (no duplicate), so the
/// `answered_version` the commit sets leaves none of them unanswered (no loss).
async fn store_held_out(
    tx: &Tx<'_>,
    lease: &Lease,
    conversation: &ConversationRef,
    held_out: &[super::HeldOut],
    v0: Version,
    forced: bool,
    now: Now,
) -> Result<Vec<OutboxRow>, StoreError> {
    let id = conversation_of(lease);
    let mut notices = Vec::new();
    for held in held_out {
        let covered: Vec<(i64, String)> = query(
            tx,
            "SELECT m.id, m.platform_message_id FROM messages m
             WHERE m.id = ANY($1) AND m.conversation_id = $2 AND ($4 OR m.version <= $3)
               AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
             ORDER BY m.id",
            &[&held.rows, &id.0, &v0.0, &!forced],
            "reading held-out messages",
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
        if covered.is_empty() {
            continue;
        }
        let outbox: i64 = query_one(
            tx,
            "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                 owner, created_at, next_attempt_at)
             VALUES ($1, 'notice', $2, $3, $4, $5, $6, $7, $7)
             RETURNING id",
            &[
                &id.0,
                &held.text,
                &held.reply_to,
                &v0.0,
                &lease.token.0,
                &lease.holder.as_str(),
                &now.db.0,
            ],
            "storing a held-out notice",
        )
        .await?
        .get(0);
        let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
        record_covers(tx, outbox, &rows).await?;
        notices.push(OutboxRow {
            id: OutboxId(outbox),
            conversation: conversation.clone(),
            kind: OutboxKind::Notice,
            text: held.text.clone(),
            reply_to: held.reply_to.clone(),
            covers: covered.into_iter().map(|(_, id)| id).collect(),
            parts_sent: 0,
            attempts: 0,
            created_at: now.to_caller(now.db),
            stored_at: now.db,
        });
    }
    Ok(notices)
}

/// Give back the reservations of the conversation's earlier leases (rounds abandoned
/// before they settled: a lost lease, a stop, a crash), each on the day it counted
/// for; budget rows are locked in the order every charge takes (day, then scope).
async fn give_back_orphans(
    tx: &Tx<'_>,
    conversation: ConversationId,
    token: LeaseToken,
) -> Result<(), StoreError> {
    let orphans = query(
        tx,
        "DELETE FROM token_reservations WHERE conversation_id = $1 AND lease_token < $2
         RETURNING day, scope, tokens",
        &[&conversation.0, &token.0],
        "reading abandoned reservations",
    )
    .await?;
    if orphans.is_empty() {
        return Ok(());
    }
    let mut sums: std::collections::BTreeMap<(String, String), i64> = Default::default();
    for r in orphans {
        *sums.entry((r.get(0), r.get(1))).or_default() += r.get::<_, i64>(2);
    }
    for ((day, scope), tokens) in &sums {
        execute(
            tx,
            "UPDATE token_usage SET tokens = GREATEST(tokens - $3::int8, 0) WHERE scope = $1 AND day = $2",
            &[scope, day, tokens],
            "giving back a reservation",
        )
        .await?;
    }
    tracing::info!(%conversation, scopes = sums.len(), "gave back the token reservation of an abandoned round");
    Ok(())
}

async fn record_covers(tx: &Tx<'_>, outbox: i64, messages: &[i64]) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO reply_covers (outbox_id, message_id) SELECT $1::int8, unnest($2::int8[])",
        &[&outbox, &messages],
        "recording covered messages",
    )
    .await?;
    Ok(())
}

/// Mark everything up to `v0` answered, after a reply or a give-up was stored in the
/// same transaction: the timer goes unless a newer message armed it, and then it is
/// re-armed for the messages still pending (its cap counting from the oldest of them).
async fn answer_through(
    tx: &Tx<'_>,
    conversation: ConversationId,
    v0: Version,
    policy: TimerPolicy,
) -> Result<(), StoreError> {
    // The answered version only grows.
    execute(
        tx,
        "UPDATE conversations SET answered_version = $2 WHERE id = $1 AND answered_version < $2",
        &[&conversation.0, &v0.0],
        "marking the batch answered",
    )
    .await?;
    // The timer goes only if nothing newer than v0 armed it.
    let deleted = execute(
        tx,
        "DELETE FROM timers WHERE conversation_id = $1 AND armed_version <= $2",
        &[&conversation.0, &v0.0],
        "deleting the timer",
    )
    .await?;
    if deleted > 0 {
        return Ok(());
    }
    let (pending, first_pending) = pending_after(tx, conversation, v0.0).await?;
    let Some(first_pending) = first_pending else {
        return Ok(());
    };
    let armed_at = query_opt(
        tx,
        "SELECT armed_at FROM timers WHERE conversation_id = $1",
        &[&conversation.0],
        "reading the timer",
    )
    .await?;
    let Some(armed_at) = armed_at.map(|r| r.get::<_, i64>(0)) else {
        return Ok(());
    };
    let due_at = policy.due_at(Timestamp(armed_at), first_pending, pending);
    execute(
        tx,
        "UPDATE timers SET due_at = GREATEST($2, held_until), attempts = 0, retry_at = 0
         WHERE conversation_id = $1",
        &[&conversation.0, &due_at.0],
        "re-arming the timer",
    )
    .await?;
    Ok(())
}

/// Every run-time access decision, oldest first.
const ACCESS_RULES: &str =
    "SELECT platform, kind, subject, allowed, set_by, set_at FROM access_rules ORDER BY set_at, id";

/// Access decisions from the rows of [`ACCESS_RULES`].
fn access_rules_of(rows: Vec<Row>) -> Result<Vec<AccessRule>, StoreError> {
    rows.into_iter()
        .map(|r| {
            super::rules::access_rule(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
        })
        .collect()
}

/// Hold a conversation's timer: not due before `until` (a later deadline is kept).
async fn hold_timer(
    tx: &Tx<'_>,
    conversation: ConversationId,
    until: Timestamp,
) -> Result<(), StoreError> {
    // Limits: a held conversation's messages wait (stored, pending) until `until`;
    // later messages, /reset and a forced commit re-arm the timer no sooner.
    execute(
        tx,
        "UPDATE timers SET held_until = GREATEST(held_until, $2), due_at = GREATEST(due_at, $2)
         WHERE conversation_id = $1",
        &[&conversation.0, &until.0],
        "holding a timer",
    )
    .await?;
    Ok(())
}

/// Outbox rows handed to the caller carry their creation time on its timeline (the
/// base of its delivery deadline, counted on its own clock). `stored_at` stays as
/// stored: it names the row, and this transaction's offset would move it.
fn on_caller_timeline(rows: &mut [OutboxRow], now: Now) {
    for row in rows {
        row.created_at = now.to_caller(row.created_at);
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

#[async_trait]
impl MessageStore for PostgresStore {
    async fn ingest(
        &self,
        message: NewMessage,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let policy = self.timers;
        let media = super::encode_media(&message.media);
        transaction!(self, Operation::Intake, "storing a message", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            let conversation = upsert_conversation(&tx, &message.conversation, message.is_group, now.db).await?;
            // No duplicate: a redelivered platform message is stored once.
            let inserted = execute(
                &tx,
                "INSERT INTO messages
                     (conversation_id, platform_message_id, user_id, author, text, version, received_at, media)
                 SELECT $1, $2::text, $3::text, $4::text, $5::text, version + 1, $6::int8, $7::text
                 FROM conversations WHERE id = $1
                 ON CONFLICT (conversation_id, platform_message_id) DO NOTHING",
                &[
                    &conversation.0,
                    &message.message_id,
                    &message.user_id,
                    &message.author,
                    &message.text,
                    &now.db.0,
                    &media,
                ],
                "storing a message",
            )
            .await?;
            if inserted == 0 {
                return Ok(IngestOutcome::Duplicate { conversation });
            }
            let (version, due_at) =
                bump_and_arm(&tx, conversation, message.conversation.platform, policy, holder, now.db).await?;
            Ok(IngestOutcome::Stored {
                conversation,
                version,
                due_at: now.to_caller(due_at),
            })
        }
        .await
        })
    }

    async fn edit(
        &self,
        edit: MessageEdit,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError> {
        let policy = self.timers;
        transaction!(self, Operation::Intake, "editing a message", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            let found = query_opt(
                &tx,
                "SELECT id, answered_version FROM conversations WHERE platform = $1 AND key = $2 FOR UPDATE",
                &[&edit.conversation.platform.as_str(), &edit.conversation.key],
                "finding a conversation",
            )
            .await?;
            let Some(found) = found else {
                return Ok(IngestOutcome::EditIgnored);
            };
            let (id, answered): (i64, i64) = (found.get(0), found.get(1));
            // Edits: only a still-pending message changes, and it counts as new.
            let changed = execute(
                &tx,
                "UPDATE messages
                 SET text = $1, version = (SELECT version + 1 FROM conversations WHERE id = $2)
                 WHERE conversation_id = $2 AND platform_message_id = $3 AND version > $4 AND text <> $1",
                &[&edit.text, &id, &edit.message_id, &answered],
                "editing a message",
            )
            .await?;
            if changed == 0 {
                return Ok(IngestOutcome::EditIgnored);
            }
            // Rate limit: an applied edit counts in its author's window, as a message.
            execute(
                &tx,
                "INSERT INTO edits (message_id, user_id, platform, edited_at)
                 SELECT id, user_id, $3, $4 FROM messages WHERE conversation_id = $1 AND platform_message_id = $2",
                &[&id, &edit.message_id, &edit.conversation.platform.as_str(), &now.db.0],
                "recording an edit",
            )
            .await?;
            let conversation = ConversationId(id);
            let (version, due_at) =
                bump_and_arm(&tx, conversation, edit.conversation.platform, policy, holder, now.db).await?;
            Ok(IngestOutcome::Stored {
                conversation,
                version,
                due_at: now.to_caller(due_at),
            })
        }
        .await
        })
    }

    async fn reset_context(
        &self,
        conversation: &ConversationRef,
        is_group: bool,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "resetting the context", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                let id = upsert_conversation(&tx, conversation, is_group, now.db).await?;
                execute(
                    &tx,
                    "UPDATE conversations SET context_version = version WHERE id = $1",
                    &[&id.0],
                    "resetting the context",
                )
                .await?;
                // /reset unsticks: pending messages are tried again now, without the backoff.
                execute(
                    &tx,
                    "UPDATE timers SET attempts = 0, retry_at = 0, armed_by = $3,
                     due_at = GREATEST(LEAST(due_at, $2), held_until)
                 WHERE conversation_id = $1",
                    &[&id.0, &now.db.0, &holder.as_str()],
                    "clearing the failure backoff",
                )
                .await?;
                Ok(())
            }
            .await
        })
    }

    async fn recent_conversations(
        &self,
        platform: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RecentConversation>, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "finding recent conversations",
            |tx| {
                async {
            let now = self.now(&tx, SystemClock.now()).await?;
            let since = match self.time {
                TimeSource::Database => now.to_db(since),
                TimeSource::Caller => since,
            };
            // No loss: catch-up resumes after the message stored last (the highest row
            // id), never after one that merely has a larger platform id.
            let rows = query(
                &tx,
                "SELECT c.key, c.is_group, m.platform_message_id
                 FROM conversations c
                 JOIN messages m ON m.id = (SELECT MAX(id) FROM messages WHERE conversation_id = c.id)
                 WHERE c.platform = $1 AND m.received_at >= $2
                 ORDER BY m.received_at DESC, m.id DESC
                 LIMIT $3",
                &[&platform.as_str(), &since.0, &(limit as i64)],
                "finding recent conversations",
            )
            .await?;
            Ok(rows
                .into_iter()
                .map(|r| RecentConversation {
                    conversation: ConversationRef::new(platform, r.get::<_, String>(0)),
                    is_group: r.get(1),
                    last_message_id: r.get(2),
                })
                .collect())
        }
        .await
            }
        )
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn claim_lease(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self.row(key, holder);
        transaction!(self, Operation::Other, "claiming a lease", |tx| async {
            let now = self.now(&tx, now).await?;
            claim(&tx, key.clone(), holder.clone(), &row, ttl, now).await
        }
        .await)
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError> {
        #[cfg(feature = "test-switches")]
        if self.faults.renewals_frozen() {
            // A frozen process: it believes it renewed; the database never heard of it.
            let mut lease = lease.clone();
            lease.expires_at = now.plus(ttl);
            return Ok(lease);
        }
        let row = self.row(&lease.key, &lease.holder);
        let ttl = crate::domain::millis(ttl);
        transaction!(self, Operation::Other, "renewing a lease", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            // Exclusive: only the live holder with this fencing token extends the
            // lease, on the database's clock.
            let renewed = query_opt(
                &tx,
                concat!(
                    "WITH clock AS (SELECT COALESCE($5::int8, ", db_now!(), ") AS t)
                     UPDATE leases SET expires_at = (SELECT t FROM clock) + $4
                     WHERE resource = $1 AND holder = $2 AND token = $3 AND expires_at > (SELECT t FROM clock)
                     RETURNING expires_at"
                ),
                &[&row.resource, &lease.holder.as_str(), &lease.token.0, &ttl, &now.fixed],
                "renewing a lease",
            )
            .await?;
            match renewed {
                Some(r) => Ok(Lease {
                    expires_at: Timestamp(r.get(0)),
                    ..lease.clone()
                }),
                None => Err(StoreError::LeaseLost(lease.key.clone())),
            }
        }
        .await
        })
    }

    async fn release_lease(
        &self,
        lease: &Lease,
        last_sent: Option<PartSent>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        transaction!(self, Operation::Other, "releasing a lease", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            if let Some(sent) = last_sent {
                mark_part_sent(&tx, sent, now.db).await?;
            }
            // Only our own claim is released: a lease taken over since stays with its holder.
            execute(
                &tx,
                "UPDATE leases SET holder = NULL WHERE resource = $1 AND holder = $2 AND token = $3",
                &[&row.resource, &lease.holder.as_str(), &lease.token.0],
                "releasing a lease",
            )
            .await?;
            Ok(())
        }
        .await
        })
    }
}

#[async_trait]
impl RoundStore for PostgresStore {
    async fn claim_round(
        &self,
        conversation: ConversationId,
        holder: &HolderId,
        ttl: Duration,
        history: usize,
        now: Timestamp,
    ) -> Result<Option<Claimed>, StoreError> {
        let key = LeaseKey::Conversation(conversation);
        let row = self.row(&key, holder);
        transaction!(self, Operation::Other, "claiming a round", |tx| async {
            let now = self.now(&tx, now).await?;
            let Some(lease) = claim(&tx, key.clone(), holder.clone(), &row, ttl, now).await? else {
                return Ok(None);
            };
            give_back_orphans(&tx, conversation, lease.token).await?;
            // What the round works on, read under the lease it just claimed.
            let batch = read_batch(&tx, conversation, history).await?;
            let (mut owed, held_back) = read_owed(&tx, conversation, now.db).await?;
            // On the caller's timeline: its deadlines are counted on its own clock.
            let mut batch = batch;
            if let Some(timer) = batch.timer.as_mut() {
                timer.due_at = now.to_caller(timer.due_at);
            }
            on_caller_timeline(&mut owed, now);
            Ok(Some(Claimed {
                lease,
                batch,
                owed,
                held_back,
            }))
        }
        .await)
    }

    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError> {
        transaction!(self, Operation::Read, "collecting a batch", |tx| async {
            read_batch(&tx, conversation, history).await
        }
        .await)
    }

    async fn commit_reply(
        &self,
        lease: &Lease,
        batch: &Batch,
        reply: NewReply,
        now: Timestamp,
    ) -> Result<CommitOutcome, StoreError> {
        let conversation = batch.conversation_id;
        let v0 = batch.v0;
        let reply_to = batch.last_message_id().map(str::to_owned);
        let row = self.row(&lease.key, &lease.holder);
        let policy = self.timers;
        transaction!(self, Operation::Other, "committing a reply", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            let version = lock_conversation(&tx, conversation).await?;
            // Fresh: a reply is committed only if no message arrived since it was
            // collected, unless the cap forces it out.
            let forced = version != v0.0;
            let oldest = batch.oldest_pending_at().unwrap_or(now.db);
            if forced && !policy.cap_reached(now.db, oldest) {
                return Ok(CommitOutcome::Stale {
                    version: Version(version),
                });
            }
            let collected: Vec<i64> = batch.pending.iter().map(|m| m.row).collect();
            // No duplicate: a message edited since it was collected is pending again
            // (its version is past v0), so the reply covers only what is unchanged.
            let covered: Vec<i64> = if forced {
                query(
                    &tx,
                    "SELECT id FROM messages WHERE id = ANY($1) AND version <= $2",
                    &[&collected, &v0.0],
                    "checking for edits",
                )
                .await?
                .into_iter()
                .map(|r| r.get(0))
                .collect()
            } else {
                collected
            };
            if covered.is_empty() {
                return Ok(CommitOutcome::Stale {
                    version: Version(version),
                });
            }
            let usage = reply.usage.unwrap_or_default();
            let outbox: i64 = query_one(
                &tx,
                "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token, forced,
                                     prompt_tokens, completion_tokens, llm_ms, owner, created_at, next_attempt_at)
                 VALUES ($1, 'reply', $2, $3, $4, $5, $6, $7, $8, $9, $11, $10, $10)
                 RETURNING id",
                &[
                    &conversation.0,
                    &reply.text,
                    &reply_to,
                    &v0.0,
                    &lease.token.0,
                    &forced,
                    &reply.usage.map(|_| usage.prompt as i64),
                    &reply.usage.map(|_| usage.completion as i64),
                    &(reply.llm_ms as i64),
                    &now.db.0,
                    &lease.holder.as_str(),
                ],
                "storing a reply",
            )
            .await?
            .get(0);
            record_covers(&tx, outbox, &covered).await?;
            let notices =
                store_held_out(&tx, lease, &batch.conversation, &reply.held_out, v0, forced, now)
                    .await?;
            answer_through(&tx, conversation, v0, policy).await?;
            Ok(CommitOutcome::Committed {
                notices,
                outbox: OutboxRow {
                    id: OutboxId(outbox),
                    conversation: batch.conversation.clone(),
                    kind: OutboxKind::Reply,
                    text: reply.text.clone(),
                    reply_to: reply_to.clone(),
                    covers: batch
                        .pending
                        .iter()
                        .filter(|m| covered.contains(&m.row))
                        .map(|m| m.message_id.clone())
                        .collect(),
                    parts_sent: 0,
                    attempts: 0,
                    created_at: now.to_caller(now.db),
                    stored_at: now.db,
                },
                forced,
            })
        }
        .await
        })
    }

    async fn give_up(
        &self,
        lease: &Lease,
        batch: &Batch,
        notice: &str,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError> {
        let conversation = batch.conversation_id;
        let v0 = batch.v0;
        let reply_to = batch.last_message_id().map(str::to_owned);
        let row = self.row(&lease.key, &lease.holder);
        let policy = self.timers;
        transaction!(self, Operation::Other, "giving up on a batch", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            lock_conversation(&tx, conversation).await?;
            // What this give-up ends: messages still pending up to v0. No duplicate: a
            // message already covered is never covered again.
            let covered: Vec<(i64, String)> = query(
                &tx,
                "SELECT m.id, m.platform_message_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                 WHERE c.id = $1 AND m.version > c.answered_version AND m.version <= $2
                   AND NOT EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.message_id = m.id)
                 ORDER BY m.id",
                &[&conversation.0, &v0.0],
                "finding the messages given up on",
            )
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
            if covered.is_empty() {
                return Ok(None);
            }
            let outbox: i64 = query_one(
                &tx,
                "INSERT INTO outbox (conversation_id, kind, text, reply_to, version, lease_token,
                                     owner, created_at, next_attempt_at)
                 VALUES ($1, 'notice', $2, $3, $4, $5, $6, $7, $7)
                 RETURNING id",
                &[&conversation.0, &notice, &reply_to, &v0.0, &lease.token.0, &lease.holder.as_str(), &now.db.0],
                "storing a give-up notice",
            )
            .await?
            .get(0);
            let rows: Vec<i64> = covered.iter().map(|(row, _)| *row).collect();
            record_covers(&tx, outbox, &rows).await?;
            answer_through(&tx, conversation, v0, policy).await?;
            Ok(Some(OutboxRow {
                id: OutboxId(outbox),
                conversation: batch.conversation.clone(),
                kind: OutboxKind::Notice,
                text: notice.to_owned(),
                reply_to: reply_to.clone(),
                covers: covered.into_iter().map(|(_, id)| id).collect(),
                parts_sent: 0,
                attempts: 0,
                created_at: now.to_caller(now.db),
                stored_at: now.db,
            }))
        }
        .await
        })
    }

    async fn store_transcript(
        &self,
        lease: &Lease,
        message: i64,
        transcript: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        let conversation = conversation_of(lease);
        transaction!(self, Operation::Other, "storing a transcript", |tx| async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            // Transcribed once: a transcript already stored is never replaced.
            let stored = execute(
                &tx,
                "UPDATE messages SET transcript = $3
                 WHERE id = $1 AND conversation_id = $2 AND transcript IS NULL",
                &[&message, &conversation.0, &transcript],
                "storing a transcript",
            )
            .await?;
            Ok(stored == 1)
        }
        .await)
    }

    async fn disarm_idle_timer(
        &self,
        lease: &Lease,
        v0: Version,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        let conversation = conversation_of(lease);
        transaction!(self, Operation::Other, "disarming an idle timer", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            lock_conversation(&tx, conversation).await?;
            // No loss: a timer with messages pending is never disarmed.
            execute(
                &tx,
                "DELETE FROM timers WHERE conversation_id = $1 AND armed_version <= $2
                   AND NOT EXISTS (SELECT 1 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                                   WHERE c.id = $1 AND m.version > c.answered_version)",
                &[&conversation.0, &v0.0],
                "disarming an idle timer",
            )
            .await?;
            Ok(())
        }
        .await
        })
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        retry_at: Timestamp,
        now: Timestamp,
    ) -> Result<u32, StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        let conversation = conversation_of(lease);
        transaction!(
            self,
            Operation::Other,
            "recording a failed generation",
            |tx| {
                async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            lock_conversation(&tx, conversation).await?;
            let retry_at = now.to_db(retry_at);
            let attempts = query_opt(
                &tx,
                "UPDATE timers SET attempts = attempts + 1, retry_at = $2, due_at = GREATEST(due_at, $2)
                 WHERE conversation_id = $1 RETURNING attempts",
                &[&conversation.0, &retry_at.0],
                "recording a failed generation",
            )
            .await?;
            Ok(attempts.map_or(0, |r| r.get::<_, i32>(0) as u32))
        }
        .await
            }
        )
    }
}

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn enqueue_notice(
        &self,
        notice: NewNotice,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError> {
        transaction!(self, Operation::Other, "queueing a notice", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            let conversation = upsert_conversation(&tx, &notice.conversation, notice.is_group, now.db).await?;
            // At most one notice per dedupe key.
            let id = query_opt(
                &tx,
                "INSERT INTO outbox (conversation_id, kind, text, reply_to, dedupe_key, owner, created_at, next_attempt_at)
                 VALUES ($1, 'notice', $2, $3, $4, $5, $6, $6)
                 ON CONFLICT (dedupe_key) DO NOTHING
                 RETURNING id",
                &[&conversation.0, &notice.text, &notice.reply_to, &notice.dedupe_key, &holder.as_str(), &now.db.0],
                "queueing a notice",
            )
            .await?;
            Ok(id.map(|r| OutboxRow {
                id: OutboxId(r.get(0)),
                conversation: notice.conversation.clone(),
                kind: OutboxKind::Notice,
                text: notice.text.clone(),
                reply_to: notice.reply_to.clone(),
                covers: Vec::new(),
                parts_sent: 0,
                attempts: 0,
                created_at: now.to_caller(now.db),
                stored_at: now.db,
            }))
        }
        .await
        })
    }

    async fn due_outbox(
        &self,
        conversation: ConversationId,
        now: Timestamp,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        transaction!(self, Operation::Read, "reading the outbox", |tx| async {
            let now = self.now(&tx, now).await?;
            let mut owed = read_owed(&tx, conversation, now.db).await?.0;
            on_caller_timeline(&mut owed, now);
            Ok(owed)
        }
        .await)
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
        transaction!(self, Operation::Other, "marking a reply sent", |tx| async {
            let now = self.now(&tx, now).await?;
            mark_part_sent(&tx, sent, now.db).await
        }
        .await)
    }

    async fn defer_outbox(
        &self,
        id: OutboxId,
        retry_at: Timestamp,
        error: &str,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "deferring a delivery", |tx| async {
            // The caller's deadline, moved onto the database's timeline (this call
            // carries no `now`: the caller's clock is the system clock).
            let now = self.now(&tx, SystemClock.now()).await?;
            let retry_at = match self.time {
                TimeSource::Database => now.to_db(retry_at),
                TimeSource::Caller => retry_at,
            };
            // No loss: a failed attempt only postpones a row that is still undelivered.
            execute(
                &tx,
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = $2, error = $3
                 WHERE id = $1 AND sent_at IS NULL AND failed_at IS NULL",
                &[&id.0, &retry_at.0, &error],
                "deferring a delivery",
            )
            .await?;
            Ok(())
        }
        .await)
    }

    async fn fail_outbox(
        &self,
        id: OutboxId,
        error: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        transaction!(self, Operation::Other, "giving up a delivery", |tx| async {
            let now = self.now(&tx, now).await?;
            // No duplicate: a row given up is never sent again; a sent row is never
            // marked failed.
            execute(
                &tx,
                "UPDATE outbox SET attempts = attempts + 1, failed_at = $2, error = $3
                 WHERE id = $1 AND sent_at IS NULL AND failed_at IS NULL",
                &[&id.0, &now.db.0, &error],
                "giving up a delivery",
            )
            .await?;
            Ok(())
        }
        .await)
    }
}

#[async_trait]
impl WorkStore for PostgresStore {
    async fn due_work(&self, work: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError> {
        if work.platforms.is_empty() {
            return Ok(DueWork::default());
        }
        let names: Vec<&str> = work.platforms.iter().map(|p| p.as_str()).collect();
        let handoff = crate::domain::millis(work.handoff);
        transaction!(self, Operation::Read, "finding due work", |tx| async {
            let now = self.now(&tx, now).await?;
            // Every part is a range scan or a seek on an index over what is due by now,
            // never a walk over every conversation or future timer. Work armed or owned
            // by another process is due here a hand-off later (its owner is woken
            // in-process). $1 now, $2 this holder, $3 hand-off, $4 platforms.
            let candidates = query(
                &tx,
                "SELECT g.conversation_id, g.at, l.holder, l.expires_at FROM (
                     SELECT conversation_id, MIN(at) AS at FROM (
                         SELECT conversation_id,
                                due_at + CASE WHEN armed_by = $2 THEN 0 ELSE $3::int8 END AS at
                         FROM timers WHERE platform = ANY($4) AND due_at <= $1
                         UNION ALL
                         SELECT o.conversation_id,
                                o.next_attempt_at + CASE WHEN o.owner = $2 THEN 0 ELSE $3::int8 END
                         FROM outbox o JOIN conversations c ON c.id = o.conversation_id
                         WHERE o.sent_at IS NULL AND o.failed_at IS NULL
                           AND o.next_attempt_at <= $1 AND c.platform = ANY($4)
                           AND NOT EXISTS (SELECT 1 FROM outbox p
                                           WHERE p.conversation_id = o.conversation_id
                                             AND p.id < o.id
                                             AND p.sent_at IS NULL AND p.failed_at IS NULL)) d
                     GROUP BY conversation_id) g
                 LEFT JOIN leases l ON l.conversation_id = g.conversation_id",
                &[&now.db.0, &work.holder.as_str(), &handoff, &names],
                "finding due work",
            )
            .await?;
            let mut scan = DueScan::new(now.db.0);
            for row in candidates {
                let conversation = ConversationId(row.get(0));
                let at: i64 = row.get(1);
                let holder: Option<String> = row.get(2);
                let expires_at: Option<i64> = row.get(3);
                scan.candidate(conversation, at, holder.is_some(), expires_at);
            }
            // The earliest future timer (one index seek per platform: a seek cannot
            // span several platforms of the (platform, due_at) index) and outbox
            // retry (one seek).
            let future = query_one(
                &tx,
                "SELECT LEAST(
                     (SELECT MIN(t.due_at) FROM unnest($2::text[]) AS p (platform)
                      CROSS JOIN LATERAL (SELECT due_at FROM timers
                                          WHERE platform = p.platform AND due_at > $1
                                          ORDER BY due_at LIMIT 1) t),
                     (SELECT MIN(next_attempt_at) FROM outbox
                      WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at > $1))",
                &[&now.db.0, &names],
                "finding the next deadline",
            )
            .await?;
            if let Some(at) = future.get::<_, Option<i64>>(0) {
                scan.sooner(at);
            }
            let (ready, next_at) = scan.finish(work.limit);
            Ok(DueWork {
                ready,
                // On the caller's timeline: when its scheduler should look again.
                next_at: next_at.map(|at| now.to_caller(Timestamp(at))),
            })
        }
        .await)
    }

    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "checking whether a conversation is settled",
            |tx| async {
                let row = query_opt(
                    &tx,
                    "SELECT c.version = c.answered_version
                        AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.conversation_id = c.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.conversation_id = c.id
                                        AND o.sent_at IS NULL AND o.failed_at IS NULL)
                 FROM conversations c WHERE c.platform = $1 AND c.key = $2",
                    &[&conversation.platform.as_str(), &conversation.key],
                    "checking whether a conversation is settled",
                )
                .await?;
                Ok(row.map(|r| r.get(0)))
            }
            .await
        )
    }

    async fn pending_conversations(&self) -> Result<u64, StoreError> {
        transaction!(
            self,
            Operation::Read,
            "counting pending conversations",
            |tx| async {
                // Kept by triggers on timers: sixteen rows, whatever the number of conversations.
                let row = query_one(
                    &tx,
                    "SELECT COALESCE(SUM(pending), 0)::int8 FROM pending_shards",
                    &[],
                    "counting pending conversations",
                )
                .await?;
                Ok(row.get::<_, i64>(0).max(0) as u64)
            }
            .await
        )
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // A read that reaches the tables, not just the connection.
        transaction!(self, Operation::Read, "reading the database", |tx| async {
            query(
                &tx,
                "SELECT 1 FROM conversations LIMIT 1",
                &[],
                "reading the database",
            )
            .await?;
            Ok(())
        }
        .await)?;
        self.condition.check()
    }

    fn wake_ups(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.armed.clone())
    }
}

#[async_trait]
impl LimitStore for PostgresStore {
    async fn hold_over_rate(
        &self,
        conversation: ConversationId,
        user_id: &str,
        rate: RateWindow,
        now: Timestamp,
    ) -> Result<Option<RateHold>, StoreError> {
        let window = crate::domain::millis(rate.window);
        transaction!(self, Operation::Other, "applying the rate limit", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            // The conversation's writers queue here (the lock order: conversation,
            // then timer), so a hold is decided on the timer as it is.
            lock_conversation(&tx, conversation).await?;
            let past_limit = query_opt(
                &tx,
                "SELECT at FROM (
                     SELECT m.received_at AS at FROM messages m JOIN conversations c ON c.id = m.conversation_id
                     WHERE m.user_id = $1 AND m.received_at > $3
                       AND c.platform = (SELECT platform FROM conversations WHERE id = $2)
                     UNION ALL
                     SELECT e.edited_at FROM edits e
                     WHERE e.user_id = $1 AND e.edited_at > $3
                       AND e.platform = (SELECT platform FROM conversations WHERE id = $2)) recent
                 ORDER BY at DESC LIMIT 1 OFFSET $4",
                &[&user_id, &conversation.0, &(now.db.0 - window), &i64::from(rate.max)],
                "counting a user's recent messages",
            )
            .await?;
            let Some(past_limit) = past_limit.map(|r| r.get::<_, i64>(0)) else {
                return Ok(None);
            };
            let until = Timestamp(past_limit).plus(rate.window);
            let held = query_opt(
                &tx,
                "SELECT held_until FROM timers WHERE conversation_id = $1 FOR UPDATE",
                &[&conversation.0],
                "reading the timer",
            )
            .await?;
            match held.map(|r| r.get::<_, i64>(0)) {
                None => Ok(None),
                Some(held_until) if held_until > now.db.0 => Ok(Some(RateHold {
                    until: now.to_caller(Timestamp(held_until)),
                    began: false,
                })),
                Some(_) => {
                    hold_timer(&tx, conversation, until).await?;
                    Ok(Some(RateHold {
                        until: now.to_caller(until),
                        began: true,
                    }))
                }
            }
        }
        .await
        })
    }

    async fn charge_tokens(
        &self,
        lease: &Lease,
        charge: &TokenCharge,
        now: Timestamp,
    ) -> Result<Charged, StoreError> {
        let row = self.row(&lease.key, &lease.holder);
        // Budget rows are locked in one order, sorted once here (by scope, each
        // scope once), every row of the charge before any is written: concurrent
        // charges queue on the first row they share and never deadlock.
        let scopes = super::rules::sorted_scopes(&charge.scopes);
        let conversation = conversation_of(lease);
        transaction!(self, Operation::Other, "charging tokens", |tx| {
            async {
            let now = self.now(&tx, now).await?;
            ensure_lease(&tx, lease, &row, now).await?;
            for scope in &scopes {
                execute(
                    &tx,
                    "INSERT INTO token_usage (scope, day, tokens) VALUES ($1, $2, 0)
                     ON CONFLICT (scope, day) DO NOTHING",
                    &[&scope.scope, &charge.day],
                    "reading a token budget",
                )
                .await?;
                // Budgets: what a scope used is read under its row lock, so two
                // charges never both fit the same remainder.
                let used: i64 = query_one(
                    &tx,
                    "SELECT tokens FROM token_usage WHERE scope = $1 AND day = $2 FOR UPDATE",
                    &[&scope.scope, &charge.day],
                    "reading a token budget",
                )
                .await?
                .get(0);
                let Some(limit) = scope.limit.filter(|_| scope.tokens > 0) else {
                    continue;
                };
                let used = used.max(0) as u64;
                if used.saturating_add(scope.tokens as u64) > limit {
                    if let Some(until) = charge.hold_until {
                        hold_timer(&tx, conversation, now.to_db(until)).await?;
                    }
                    return Ok(Charged::Over {
                        scope: scope.scope.clone(),
                        used,
                        limit,
                    });
                }
            }
            for scope in &scopes {
                // Totals are only ever added to, never written back from a read.
                execute(
                    &tx,
                    "UPDATE token_usage SET tokens = GREATEST(tokens + $3::int8, 0) WHERE scope = $1 AND day = $2",
                    &[&scope.scope, &charge.day, &scope.tokens],
                    "charging tokens",
                )
                .await?;
            }
            match charge.reservation {
                Reservation::None => {}
                Reservation::Reserve => {
                    // Every reservation expires: recorded under the lease's token, it
                    // is given back at the next claim unless settled.
                    for scope in &scopes {
                        execute(
                            &tx,
                            "INSERT INTO token_reservations (conversation_id, lease_token, day, scope, tokens)
                             VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (conversation_id, lease_token, day, scope)
                             DO UPDATE SET tokens = token_reservations.tokens + EXCLUDED.tokens",
                            &[&conversation.0, &lease.token.0, &charge.day, &scope.scope, &scope.tokens],
                            "recording a reservation",
                        )
                        .await?;
                    }
                }
                Reservation::Settle => {
                    execute(
                        &tx,
                        "DELETE FROM token_reservations WHERE conversation_id = $1 AND lease_token = $2",
                        &[&conversation.0, &lease.token.0],
                        "settling a reservation",
                    )
                    .await?;
                }
            }
            Ok(Charged::Charged)
        }
        .await
        })
    }

    async fn token_usage(&self, day: &str, scopes: &[String]) -> Result<Vec<u64>, StoreError> {
        transaction!(self, Operation::Read, "reading token usage", |tx| async {
            let rows = query(
                &tx,
                "SELECT s.scope, COALESCE(u.tokens, 0) FROM unnest($2::text[]) AS s (scope)
                 LEFT JOIN token_usage u ON u.scope = s.scope AND u.day = $1",
                &[&day, &scopes],
                "reading token usage",
            )
            .await?;
            let used: std::collections::HashMap<String, i64> =
                rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
            Ok(scopes
                .iter()
                .map(|scope| used.get(scope).copied().unwrap_or(0).max(0) as u64)
                .collect())
        }
        .await)
    }

    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError> {
        transaction!(
            self,
            Operation::Other,
            "recording an access decision",
            |tx| {
                async {
            execute(
                &tx,
                "INSERT INTO access_rules (platform, kind, subject, allowed, set_by, set_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (platform, kind, subject) DO UPDATE SET
                     allowed = excluded.allowed, set_by = excluded.set_by, set_at = excluded.set_at",
                &[
                    &rule.subject.platform.as_str(),
                    &rule.subject.kind.as_str(),
                    &rule.subject.id,
                    &rule.allowed,
                    &rule.set_by,
                    &rule.set_at.0,
                ],
                "recording an access decision",
            )
            .await?;
            Ok(())
        }
        .await
            }
        )
    }

    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError> {
        transaction!(self, Operation::Read, "reading access decisions", |tx| {
            async {
                access_rules_of(query(&tx, ACCESS_RULES, &[], "reading access decisions").await?)
            }
            .await
        })
    }
}
