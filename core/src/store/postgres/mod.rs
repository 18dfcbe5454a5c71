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
//! one lock order (lease row, then conversation row, then timer or journal row), so
//! transactions queue instead of deadlocking:
//! - `ingest`, `edit`, `enqueue_notice`, `reset_context` lock the conversation row
//!   first (`FOR UPDATE`, or the upsert's `ON CONFLICT DO UPDATE` that creates it):
//!   the version bump, the pending count and the timer arm are then decided with no
//!   other writer of the conversation in between. `ingest` is one call of the
//!   schema's `lull_ingest` function (migration 14), its statements in that order;
//!   messages stored together (`ingest.rs`, `lull_ingest_many`, migrations 15 and
//!   16, row by row or as sets) take all their conversation rows first, by
//!   (platform, key), then the `pending_shards` counter rows their timers touch, by
//!   shard: the same order in every group of every replica, so groups queue instead
//!   of deadlocking.
//! - `claim_lease`, `claim_round`: the compare-and-swap upsert `INSERT … ON CONFLICT
//!   DO UPDATE … WHERE free or expired RETURNING token` waits for a concurrent claim
//!   and decides on the row that claim left (the conflict path reads the latest row
//!   version, whatever the snapshot), so two claimers never both win. `claim_round`
//!   then reads the batch under a `FOR SHARE` lock of the conversation row, taken by
//!   the first of its pipelined reads: no ingest commits while it reads, so version,
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
//! - `reserve_action`: the lease row `FOR UPDATE` (fencing), then the conversation row
//!   `FOR UPDATE` (the final check at `v0`; reservations of one conversation queue
//!   there, so two of one key never both insert), then the journal row of its key
//!   `FOR UPDATE`. `decide_action`: the journal row alone `FOR UPDATE` (of two
//!   deciders, the second reads what the first left).
//! - `renew_lease`, `release_lease`, `mark_sent`, `defer_outbox`, `fail_outbox`,
//!   `finish_action`: one conditional UPDATE each, atomic on its row (`release_lease`
//!   with the last sent-mark in the same statement).
//! - `collect`, `due_work` and the other reads: READ COMMITTED reads (`collect` under
//!   the same `FOR SHARE` lock as `claim_round`); `due_work` only proposes work, the
//!   claim decides.
//!
//! A serialization failure, a deadlock or a lock wait past the statement timeout is
//! [`StoreError::Busy`] and the transaction is retried a few times; a lost connection
//! is [`StoreError::Pool`] (transient: the dispatcher tries again, nothing is lost,
//! and an ingest it was unsure of is idempotent on the platform message id).
//!
//! # Round trips
//! The hot paths send as few round trips as their decisions allow: `ingest`,
//! `claim_lease`, `renew_lease`, `mark_sent` and `release_lease` are one statement each
//! (no BEGIN, no COMMIT: a statement is its own transaction; under load, messages that
//! wait for a free ingest sender share one: `ingest.rs`), reading the database's
//! clock inside the statement and handing back the time it used where the caller needs
//! the translation (`clock.rs`). The rest run in `transaction!`s whose independent
//! statements are prepared first and then sent together (pipelined: the server runs
//! them in the order sent, so the lock order holds): a round's claim is BEGIN, the
//! claim, the give-back of abandoned reservations, every read of the batch and the
//! outbox at once, COMMIT; a commit is BEGIN, clock + lease + conversation at once
//! (`PostgresStore::fence`), the reply with its covers, answered + timer at once,
//! COMMIT. Every statement is prepared once per pooled connection.
//!
//! # Wake-ups
//! An ingest announces its timer (`NOTIFY lull_armed`, the platform as payload, sent
//! only if it commits) only when it is due before every future timer of its platform:
//! every replica already wakes by the earliest of those (the next deadline its
//! due-work query returned, or that timer's own announcement) and then reads the
//! timers as they are, so a burst, or a busy platform, announces nothing and does not
//! wake every replica once per message. Each process keeps one `LISTEN` connection
//! (reconnected after a drop, and looking once then) that wakes its scheduler only for
//! the platforms it serves. What no announcement reaches (a replica that looked just
//! before the commit, a dropped connection) the poll finds within `LULL_POLL_MS`,
//! which is the hand-off after which a replica may take another's timer at all; the
//! replica that armed a timer is woken in-process.
//!
//! # Layout
//! This file opens the pool, migrates and inspects the database (`lull check`). The
//! contract's areas are one file each, named as in the SQLite backend and the
//! conformance suite: `messages.rs`, `leases.rs`, `rounds.rs`, `outbox.rs`, `work.rs`,
//! `limits.rs`, `actions.rs`, `settings.rs`, `reactions.rs`, `rhythm.rs`,
//! `overheard.rs`, `threads.rs`, `status.rs`, `jobs.rs`, `memories.rs`, `summaries.rs`; `ingest.rs` stores messages that arrive
//! together in one call. `clock.rs` holds the clock translation (`Now`, `db_now!`),
//! `sql.rs` the statement helpers (errors with their context, `query`/`execute`,
//! `transaction!`), `schema.rs` the migrations, `listen.rs` the wake-ups.

#[macro_use]
mod clock;
#[macro_use]
mod sql;

mod actions;
mod ingest;
mod jobs;
mod leases;
mod limits;
mod listen;
mod memories;
mod messages;
mod outbox;
mod overheard;
mod reactions;
mod rhythm;
mod rounds;
pub(crate) mod schema;
mod settings;
mod status;
mod summaries;
mod threads;
mod work;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};

use super::condition::Condition;
#[cfg(feature = "test-switches")]
use super::faults::FaultPlan;
use super::faults::Operation;
use super::lease_rows::{LeaseRow, LeaseRows};
use super::{AccessRule, StoreError};
use crate::domain::{HolderId, LeaseKey};
use crate::timing::TimerPolicy;
pub use clock::TimeSource;
use limits::{ACCESS_RULES, access_rules_of};
use sql::{describe, pool_reason};

/// Connections per process. Ingest keeps at most `ingest::SENDERS` (1) call in
/// flight, storing the messages that wait meanwhile together; sixteen per process
/// leave the rest to rounds and deliveries beside a full ingest load. Four replicas
/// then use at most 4 × (16 + 1 listener) = 68 connections, within PostgreSQL's
/// default `max_connections` (100); docs/scaling-out.md says what to set for more.
/// Opened lazily: an idle process keeps one or two.
pub(crate) const POOL_SIZE: usize = 16;
/// Which idle connection a call gets: the one returned last. A connection's first
/// call of each ingest function plans it (about 10 ms of the server's time for
/// `lull_ingest_many`), and its caches warm with use; handing out the connections in
/// turn (first in, first out) made every connection of the pool pay that, a new
/// replica's sixteen during its first seconds under load, while last in, first out
/// keeps the steady work on the few connections already warm.
const QUEUE_MODE: QueueMode = QueueMode::Lifo;
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

/// A [`Store`](super::Store) on a PostgreSQL database. A clone is the same store
/// (one pool, one ingest queue, one listener).
#[derive(Clone)]
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
    /// The platforms this process's scheduler serves, as its due-work query names them:
    /// only their announcements wake it.
    served: Arc<listen::Served>,
    /// The LISTEN connection's task, stopped with the store.
    _listener: Arc<listen::Listener>,
    /// Messages waiting for a free ingest sender (`ingest.rs`).
    ingests: Arc<ingest::Ingests>,
    /// Whether messages that wait together are stored together (off only for the
    /// counter-test: every message its own call, as many in flight as callers).
    grouped: bool,
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
    /// The active jobs' schedules, soonest first.
    pub jobs: Vec<crate::store::StoredSchedule>,
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

impl PostgresStore {
    /// Connect to the database at `url` and bring its schema up to date (safe when
    /// several replicas start at once); timers are armed by `timers`, deadlines are
    /// read on the clock `time` names (production: [`TimeSource::Database`]).
    pub async fn open(
        url: &str,
        timers: TimerPolicy,
        time: TimeSource,
    ) -> Result<Self, StoreError> {
        Self::open_queued(url, timers, time, QUEUE_MODE).await
    }

    /// The counter-test's switch for the pool's order: [`PostgresStore::open`], but
    /// the idle connections are handed out in turn (first in, first out), so steady
    /// work visits every connection the pool ever opened. Exists only in builds with
    /// the `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub async fn open_handing_connections_out_in_turn(
        url: &str,
        timers: TimerPolicy,
        time: TimeSource,
    ) -> Result<Self, StoreError> {
        Self::open_queued(url, timers, time, QueueMode::Fifo).await
    }

    async fn open_queued(
        url: &str,
        timers: TimerPolicy,
        time: TimeSource,
        queue_mode: QueueMode,
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
            .queue_mode(queue_mode)
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
        let served = Arc::new(listen::Served::default());
        let listener = Arc::new(listen::Listener::start(
            config,
            tls,
            CHANNEL,
            armed.clone(),
            served.clone(),
        ));
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
            served,
            _listener: listener,
            ingests: Arc::default(),
            grouped: true,
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
            // The jobs arrived with schema 20.
            let jobs = if schema >= 20 {
                client.query(crate::store::STORED_SCHEDULES, &[]).await?
            } else {
                Vec::new()
            };
            Ok::<_, tokio_postgres::Error>((schema, server, access, jobs))
        }
        .await;
        drop(client);
        driver.abort();
        let (schema, server, access, jobs) = found.map_err(|e| open_error(describe(&e)))?;
        let jobs = jobs
            .iter()
            .map(|r| crate::store::StoredSchedule {
                id: r.get(0),
                schedule: r.get(1),
                timezone: r.get(2),
                next_at: r.get::<_, Option<i64>>(3).map(crate::domain::Timestamp),
            })
            .collect();
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
            jobs,
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

    /// The counter-test's switch for grouped ingest: every message is its own call of
    /// `lull_ingest`, sent at once, however many are in flight. Exists only in builds
    /// with the `test-switches` feature.
    #[cfg(feature = "test-switches")]
    pub fn without_grouped_ingest(mut self) -> Self {
        self.grouped = false;
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

    fn row(&self, key: &LeaseKey, holder: &HolderId) -> LeaseRow {
        self.lease_rows.row(key, holder)
    }
}
