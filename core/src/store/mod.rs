//! The store: the only shared state between lull processes.
//!
//! The dispatcher talks to it through the [`Store`] trait alone, so both backends
//! (SQLite for one host, PostgreSQL for several) run the same test suite. Every method
//! is one short transaction; none writes back a row it read earlier, each changes
//! only its own fields. Methods that act under a lease take the [`Lease`] and check
//! holder, fencing token and expiry inside the same transaction as their writes.
//!
//! - The contract is spelled once, in [`Store`]; a backend is opened with the
//!   deployment's [`TimerPolicy`] and reports failures as a backend-neutral
//!   [`StoreError`].
//! - `conformance` (feature `conformance`): the contract as one test body every
//!   backend runs.
//! - `FaultPlan` (feature `test-switches`): faults a test injects into a real backend.
//! - [`SqliteStore`]: the backend on one SQLite file (schema migrations, condition
//!   tracking and fault hooks are its private parts).
//! - [`PostgresStore`]: the backend on one PostgreSQL database, for replicas on
//!   several hosts (its isolation per method, its clock and its wake-ups are in its
//!   module docs).
//! - [`open`]: the store a `DATABASE_URL` names ([`DatabaseUrl`]).
//! - [`backup`]: `lull backup`, a consistent copy of a SQLite database while it runs.
//!
//! # Time
//! Every method is given `now`, and deadlines (lease expiry, timer and retry due
//! times) are compared in the store. On SQLite every process is on one host and reads
//! one clock, so the callers' `now` is that clock. On PostgreSQL the processes are on
//! several hosts whose clocks may disagree, so in production the database's clock
//! decides ([`TimeSource::Database`]): the caller's `now` only moves the times it
//! passes in and gets back between its timeline and the database's. Tests that drive
//! time themselves (the conformance checks) open it with [`TimeSource::Caller`].

pub mod backup;
mod condition;
#[cfg(feature = "conformance")]
pub mod conformance;
mod faults;
mod lease_rows;
mod migrations;
mod postgres;
mod shared;
mod sqlite;

use async_trait::async_trait;

pub use crate::access::{AccessRule, Subject};
pub use crate::domain::{Exchange, OutboxKind, TokenUsage};
pub use lull_port::RecentConversation;
use lull_port::{Media, MediaKind};

use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, OutboxId, Platform, Timestamp,
    Version,
};
use crate::timing::TimerPolicy;

#[cfg(feature = "test-switches")]
pub use faults::FaultPlan;
use lull_port::secrets::redact_url as redacted_url;
pub use postgres::{PostgresInspection, PostgresStore, TimeSource};
/// The PostgreSQL schema version this build migrates to.
pub const POSTGRES_SCHEMA: i64 = postgres::schema::LATEST;
pub use sqlite::{Inspection, SqliteStore};

/// Where the store lives, from `DATABASE_URL`.
#[derive(Clone)]
pub enum DatabaseUrl {
    /// `sqlite:PATH` (also `sqlite://PATH`): one file, for processes on one host.
    Sqlite(std::path::PathBuf),
    /// `postgres://…` or `postgresql://…`: one database for replicas on several hosts.
    /// Kept whole (it may carry a password); shown only through [`DatabaseUrl::shown`].
    Postgres(secrecy::SecretString),
}

impl DatabaseUrl {
    /// Read a `DATABASE_URL`; anything but `sqlite:PATH`, `postgres://…` or
    /// `postgresql://…` is refused with a message naming the variable.
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let parsed = url::Url::parse(url).map_err(|e| {
                format!(
                    "DATABASE_URL is not a valid PostgreSQL URL ({e}): {}",
                    redacted_url(url)
                )
            })?;
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(format!(
                    "DATABASE_URL must name the PostgreSQL host, got {}",
                    redacted_url(url)
                ));
            }
            // The driver's own reading (parameters such as `sslmode`), checked at start.
            <tokio_postgres::Config as std::str::FromStr>::from_str(url).map_err(|e| {
                format!(
                    "DATABASE_URL is not a valid PostgreSQL URL ({e}): {}",
                    redacted_url(url)
                )
            })?;
            return Ok(DatabaseUrl::Postgres(url.to_owned().into()));
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| {
                format!(
                    "DATABASE_URL must be sqlite:PATH (for example sqlite:lull.db) or postgres://…, got '{}'",
                    redacted_url(url)
                )
            })?;
        if path.is_empty() || path.starts_with(':') {
            return Err(format!(
                "DATABASE_URL must name a database file (sqlite:PATH), got '{url}'"
            ));
        }
        Ok(DatabaseUrl::Sqlite(path.into()))
    }

    /// The PostgreSQL password, if the URL carries one: registered for redaction
    /// (`lull_port::secrets`) before anything logs. It is the password as the driver
    /// reads it and sends it to the server, from the user info or a `password=`
    /// parameter: percent-decoded (`%40` is `@`), and nothing else. Not form-decoded:
    /// a URL's user info is no form, so `+`, `=` and `&` are themselves (a form
    /// decoder makes `+` a space and cuts at `=` or `&`, and the real password would
    /// then be logged unredacted).
    pub fn password(&self) -> Option<secrecy::SecretString> {
        let DatabaseUrl::Postgres(url) = self else {
            return None;
        };
        let config = <tokio_postgres::Config as std::str::FromStr>::from_str(
            secrecy::ExposeSecret::expose_secret(url),
        )
        .ok()?;
        let password = config.get_password().filter(|p| !p.is_empty())?;
        Some(String::from_utf8_lossy(password).into_owned().into())
    }

    /// The URL as it may be shown: no credentials, no query.
    pub fn shown(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(path) => path.display().to_string(),
            DatabaseUrl::Postgres(url) => redacted_url(secrecy::ExposeSecret::expose_secret(url)),
        }
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

/// Open the store at `url` (creating and migrating it if needed), as a `lull run` or
/// `lull chat` process uses it; its timers are armed by `timers`. On PostgreSQL every
/// deadline is kept on the database's clock ([`TimeSource::Database`]); on SQLite
/// every process is on one host and shares its clock.
///
/// In builds with the `test-switches` feature (tests only), `LULL_TEST_DISABLE_LEASE=1`
/// opens it with leases that exclude no one (each process claims private lease rows,
/// see `LeaseRows`): the counter-test's switch.
pub async fn open(
    url: &DatabaseUrl,
    timers: TimerPolicy,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    Ok(match url {
        DatabaseUrl::Sqlite(path) => std::sync::Arc::new(counter_test_switch(
            SqliteStore::open(path, timers)?,
            #[cfg(feature = "test-switches")]
            SqliteStore::without_lease_checks,
        )),
        DatabaseUrl::Postgres(url) => std::sync::Arc::new(counter_test_switch(
            PostgresStore::open(
                secrecy::ExposeSecret::expose_secret(url),
                timers,
                TimeSource::Database,
            )
            .await?,
            #[cfg(feature = "test-switches")]
            PostgresStore::without_lease_checks,
        )),
    })
}

/// The counter-test's switch, read from the environment (`LULL_TEST_DISABLE_LEASE=1`)
/// in builds with the `test-switches` feature: `without_lease_checks` applied to the
/// store; the store unchanged in every other build.
fn counter_test_switch<S>(
    store: S,
    #[cfg(feature = "test-switches")] without_lease_checks: fn(S) -> S,
) -> S {
    #[cfg(feature = "test-switches")]
    if std::env::var("LULL_TEST_DISABLE_LEASE").is_ok_and(|v| v == "1") {
        tracing::warn!(
            "LULL_TEST_DISABLE_LEASE=1: lease checks are OFF (counter-test build); replies may be duplicated"
        );
        return without_lease_checks(store);
    }
    store
}

/// Why a store operation failed. `Busy` and `Full` are conditions of the database
/// the caller may wait out; `LeaseLost` means the caller no longer owns what it was
/// acting on and must abandon its work.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Locked by another writer past the busy timeout: wait and try again.
    #[error("the database is busy (locked by another writer longer than the busy timeout)")]
    Busy,
    /// No room for the write: nothing was stored; wait for space.
    #[error("the database or its disk is full")]
    Full,
    /// Pages of the file do not parse: only restoring a backup helps.
    #[error("the database file is damaged ({0}); restore it from a backup")]
    Damaged(String),
    /// The file cannot be read or written (permissions, a failing disk).
    #[error("the database file cannot be read or written: {0}")]
    Io(String),
    /// Exclusive: the caller's lease expired or was taken over, so its write was
    /// refused (fencing) and the work it protected must be abandoned.
    #[error("the lease on {0} was lost (expired or taken over)")]
    LeaseLost(LeaseKey),
    #[error("conversation {0} does not exist")]
    NoConversation(ConversationId),
    /// The database cannot be opened or brought up to date at start.
    #[error("cannot open the database at {path}: {reason}")]
    Open { path: String, reason: String },
    /// Any other failure of the backend, in its own words: the error names no
    /// backend's types, so every backend reports through the same enum.
    #[error("database error while {context}: {message}")]
    Backend {
        context: &'static str,
        message: String,
    },
    /// A value in the database this build cannot read (an unknown platform name).
    #[error("unexpected data in the database: {0}")]
    Corrupt(String),
    /// No connection came free in time, or the task running the query failed.
    #[error("database connection pool: {0}")]
    Pool(String),
}

impl StoreError {
    /// Whether waiting and trying again may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Busy | StoreError::Full | StoreError::Pool(_)
        )
    }
}

/// Media references as every backend stores them: one nullable text column holding a
/// JSON array (`NULL` for a message without media), so the schema change is one column
/// in any backend.
pub fn encode_media(media: &[Media]) -> Option<String> {
    if media.is_empty() {
        return None;
    }
    let items: Vec<serde_json::Value> = media
        .iter()
        .map(|m| {
            serde_json::json!({
                "kind": m.kind.as_str(),
                "ref": m.reference,
                "size": m.size,
                "mime": m.mime,
                "secs": m.duration_secs,
            })
        })
        .collect();
    Some(serde_json::Value::Array(items).to_string())
}

/// The media references [`encode_media`] stored.
pub fn decode_media(stored: Option<&str>) -> Result<Vec<Media>, StoreError> {
    let Some(stored) = stored else {
        return Ok(Vec::new());
    };
    let corrupt = |why: &str| StoreError::Corrupt(format!("media of a message: {why}"));
    let items: Vec<serde_json::Value> =
        serde_json::from_str(stored).map_err(|e| corrupt(&e.to_string()))?;
    items
        .iter()
        .map(|item| {
            let kind = item["kind"]
                .as_str()
                .and_then(MediaKind::parse)
                .ok_or_else(|| corrupt("unknown kind"))?;
            let reference = item["ref"]
                .as_str()
                .ok_or_else(|| corrupt("no reference"))?
                .to_owned();
            Ok(Media {
                kind,
                reference,
                size: item["size"].as_u64(),
                mime: item["mime"].as_str().map(str::to_owned),
                duration_secs: item["secs"].as_u64().map(|s| s as u32),
            })
        })
        .collect()
}

/// A new message as the store keeps it.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub conversation: ConversationRef,
    pub is_group: bool,
    /// The platform's message id; a second message with the same id in the same
    /// conversation is a redelivery and is not stored again.
    pub message_id: String,
    pub user_id: String,
    pub author: String,
    /// The text as prompts and history show it: for media, the caption after its
    /// marker (`[image] what is this?`).
    pub text: String,
    /// Media references sent with the message, stored with it in the same
    /// transaction (no loss: a crash before the reply keeps them).
    pub media: Vec<Media>,
}

/// An edit of a message by its platform id.
#[derive(Debug, Clone)]
pub struct MessageEdit {
    pub conversation: ConversationRef,
    pub message_id: String,
    pub text: String,
}

/// What ingest did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngestOutcome {
    /// Stored (or, for an edit, applied): the version was bumped and the timer armed.
    Stored {
        conversation: ConversationId,
        version: Version,
        due_at: Timestamp,
    },
    /// Already stored earlier (a redelivered update): nothing changed.
    Duplicate { conversation: ConversationId },
    /// An edit of a message that is unknown, unchanged or already answered: ignored.
    EditIgnored,
}

/// A notice is an outbox row that answers no message: help text, a "text only" hint,
/// an access denial, a failure notice. It never enters the model's history.
#[derive(Debug, Clone)]
pub struct NewNotice {
    pub conversation: ConversationRef,
    pub is_group: bool,
    pub text: String,
    pub reply_to: Option<String>,
    /// At most one notice per key is ever stored, so a redelivered command or a
    /// repeated failure does not notify twice.
    pub dedupe_key: String,
}

/// Which work a process looks for.
#[derive(Debug, Clone)]
pub struct WorkQuery {
    /// Only timers and outbox rows of these platforms (the ones this process serves).
    pub platforms: Vec<Platform>,
    /// This process: timers it armed and rows it owns are due at once.
    pub holder: HolderId,
    /// How much later another process's work is due here.
    pub handoff: std::time::Duration,
    /// At most this many conversations per call.
    pub limit: usize,
}

/// Conversations that need a round now, and when to look again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueWork {
    /// Conversations with a due timer or a due outbox row, and no live lease.
    pub ready: Vec<ConversationId>,
    /// The earliest future moment something else becomes due (a timer, an outbox
    /// retry, a lease expiry that frees a due conversation).
    pub next_at: Option<Timestamp>,
}

/// A stored message waiting for its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMessage {
    /// The store's row id (what `covers` records).
    pub row: i64,
    pub message_id: String,
    pub user_id: String,
    pub author: String,
    pub text: String,
    pub version: Version,
    pub received_at: Timestamp,
    /// Media references stored with the message; only the pending batch fetches them.
    pub media: Vec<Media>,
    /// The transcript of its voice note or audio, once stored ([`Store::store_transcript`]).
    pub transcript: Option<String>,
}

impl PendingMessage {
    /// The text the model sees: the stored text, then the transcript, if any.
    pub fn said(&self) -> String {
        said_text(&self.text, self.transcript.as_deref())
    }
}

/// A message's text as prompts and history show it: `[voice message]: <transcript>`
/// once transcribed, else the stored text.
pub fn said_text(text: &str, transcript: Option<&str>) -> String {
    match transcript {
        Some(transcript) => format!("{text}: {transcript}"),
        None => text.to_owned(),
    }
}

/// Everything a round needs to generate a reply, read in one snapshot.
#[derive(Debug, Clone)]
pub struct Batch {
    pub conversation_id: ConversationId,
    pub conversation: ConversationRef,
    pub is_group: bool,
    /// The version when collected: the reply may only be committed while the
    /// conversation is still at this version (or the cap forces it).
    pub v0: Version,
    /// Every message after `answered_version`, oldest first.
    pub pending: Vec<PendingMessage>,
    /// The most recent exchanges since the last `/reset`, oldest first.
    pub history: Vec<Exchange>,
    /// The conversation's timer: when it is due and how many rounds failed in a row.
    pub timer: Option<TimerState>,
}

impl Batch {
    /// When the oldest pending message arrived (the base of the cap).
    pub fn oldest_pending_at(&self) -> Option<Timestamp> {
        self.pending.iter().map(|m| m.received_at).min()
    }

    /// The platform message id a reply should quote: the last message of the batch.
    pub fn last_message_id(&self) -> Option<&str> {
        self.pending.last().map(|m| m.message_id.as_str())
    }
}

/// A conversation's timer as a round sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerState {
    pub due_at: Timestamp,
    pub attempts: u32,
}

/// A generated reply, ready for the final check.
#[derive(Debug, Clone)]
pub struct NewReply {
    pub text: String,
    pub usage: Option<TokenUsage>,
    pub llm_ms: u64,
    /// Messages of the batch left out of the reply (a group member over their token
    /// budget): each entry is stored as a notice covering them, in the commit's
    /// transaction, so they are answered exactly once, by the notice, or, if the reply
    /// is stale, not at all and still pending.
    pub held_out: Vec<HeldOut>,
}

/// Messages a reply leaves out, and the notice that answers them instead
/// ([`NewReply::held_out`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOut {
    /// The message rows ([`PendingMessage::row`]) the notice covers; each must have
    /// been collected with the batch (pending up to its `v0`).
    pub rows: Vec<i64>,
    pub text: String,
    /// The platform message id the notice quotes.
    pub reply_to: Option<String>,
}

/// The result of the final check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Stored in the outbox (the row, ready to deliver); the batch is answered.
    /// `forced` when newer messages had arrived but the cap made the reply go out
    /// anyway. `notices`: the rows of [`NewReply::held_out`] stored with it (a
    /// held-out set whose every message was edited since is not stored).
    Committed {
        outbox: OutboxRow,
        forced: bool,
        notices: Vec<OutboxRow>,
    },
    /// A newer message arrived during generation: nothing stored, timer kept.
    Stale { version: Version },
}

/// What a round claims, read in the transaction that claimed it: the lease, the batch
/// to answer, and the outbox rows already owed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub lease: Lease,
    pub batch: Batch,
    /// Undelivered rows due now, oldest first (replies an earlier holder committed,
    /// deferred sends, notices): delivered before anything the round commits, since
    /// delivery keeps outbox order.
    pub owed: Vec<OutboxRow>,
    /// An undelivered row after `owed` waits for its retry: what the round commits
    /// waits behind it (delivery keeps outbox order), delivered by a later round.
    pub held_back: bool,
}

/// The last part a round delivered, recorded in the transaction that releases the
/// round's lease (one write instead of two). A fact, not a decision: it is recorded
/// even when the lease was lost meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSent {
    pub outbox: OutboxId,
    /// Parts delivered so far.
    pub parts_sent: u32,
    /// Whether that was the row's last part.
    pub done: bool,
}

/// An outbox row waiting to be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: OutboxId,
    pub conversation: ConversationRef,
    pub kind: OutboxKind,
    pub text: String,
    pub reply_to: Option<String>,
    /// Platform message ids of the messages a reply covers; for a notice, those a
    /// give-up ([`Store::give_up`]) ended (empty for other notices).
    pub covers: Vec<String>,
    /// Parts already delivered: delivery resumes after them.
    pub parts_sent: u32,
    /// Failed delivery attempts so far (every one is recorded before the next).
    pub attempts: u32,
    /// When the row was committed, on the caller's timeline: the base of its delivery
    /// deadline. On PostgreSQL it is translated from the database's clock by an offset
    /// measured afresh in each transaction, so two reads of one row may disagree by a
    /// few milliseconds (or by any clock skew between hosts): it names no row.
    pub created_at: Timestamp,
    /// When the row was committed, exactly as stored: on the database's timeline
    /// (PostgreSQL's clock in production; on SQLite, and under `TimeSource::Caller`,
    /// the committing caller's `now`), never translated. The same in every read, from
    /// every process, for the row's life; with `id` it names the row across retries
    /// and processes, and not again in another database whose ids start again at 1
    /// (a webhook's `webhook-id` is made of both). Not a time to compare with a
    /// clock: use `created_at` for that.
    pub stored_at: Timestamp,
}

/// A rate limit as [`Store::hold_over_rate`] applies it: at most `max` messages of one
/// user per `window`, across every conversation on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    pub max: u32,
    pub window: std::time::Duration,
}

/// A conversation held by a rate limit: its timer is not due before `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHold {
    /// When the window has room again and the held messages are answered together.
    pub until: Timestamp,
    /// Whether this call began the hold (tell the user once, then).
    pub began: bool,
}

/// One scope's part of a token charge ([`Store::charge_tokens`]). A scope names who
/// spent: `user:<platform>:<id>`, `conversation:<id>`, `bot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeCharge {
    pub scope: String,
    /// Tokens to add (negative: give back part of a reservation).
    pub tokens: i64,
    /// The scope's budget for the day, if it has one and this charge must fit it.
    pub limit: Option<u64>,
}

/// A token charge: what several scopes spend on one day, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCharge {
    /// The day the tokens count for, as the deployment's time zone names it
    /// (`2026-12-01`). A settle names the day of its reservation, whenever it runs.
    pub day: String,
    pub scopes: Vec<ScopeCharge>,
    /// When a budget would be exceeded: the moment it resets (the next day), until
    /// which the conversation's timer is held; `None`: a refused charge holds nothing
    /// (the round answers the rest of a group without the member over budget).
    pub hold_until: Option<Timestamp>,
    /// What the charge does to the lease's reservation.
    pub reservation: Reservation,
}

/// A charge's part in a round's reservation. A reservation is recorded in the
/// database, keyed by the conversation, the lease token and the day, so a round that
/// never settles (its lease lost, a stop, a crash) gives it back at the next claim of
/// the conversation ([`Store::claim_round`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// A plain charge: spent, nothing to give back.
    None,
    /// The most a round may spend, before the model is asked: recorded as the
    /// lease's reservation (added to one recorded earlier under the same lease).
    Reserve,
    /// The round's reservation turned into what was spent: the charge is the
    /// difference, and the lease's recorded reservation is forgotten.
    Settle,
}

/// What a token charge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charged {
    /// Every scope was charged.
    Charged,
    /// `scope` would pass its `limit` (it has `used` today): nothing was charged and
    /// the conversation's timer is held until the charge's `hold_until`.
    Over {
        scope: String,
        used: u64,
        limit: u64,
    },
}

/// The shared state lull runs on. See the module docs for the rules every method keeps.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Store a message, bump the conversation's version and arm its timer, in one
    /// transaction. Idempotent on the platform message id.
    async fn ingest(
        &self,
        message: NewMessage,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError>;

    /// Replace the text of a still-pending message; counts as a new message (version
    /// bump, timer re-armed, and in its author's rate window: see
    /// [`Store::hold_over_rate`]). Edits of answered or unknown messages, and edits
    /// that change nothing, are ignored (and not counted).
    async fn edit(
        &self,
        edit: MessageEdit,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<IngestOutcome, StoreError>;

    /// Queue a notice for delivery, at most once per dedupe key. Returns the row if it
    /// was queued now (`None`: an earlier one with that key exists).
    async fn enqueue_notice(
        &self,
        notice: NewNotice,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError>;

    /// Start a fresh context: earlier exchanges are kept but no longer offered as
    /// history. Pending messages are kept and answered in the fresh context, at once:
    /// the timer's failure backoff is cleared and it is due now for `holder` (the
    /// process that took the command), so `/reset` always unsticks a conversation;
    /// but not before a limit's hold ends ([`Store::hold_over_rate`],
    /// [`Store::charge_tokens`]): it is no way around a limit.
    async fn reset_context(
        &self,
        conversation: &ConversationRef,
        is_group: bool,
        holder: &HolderId,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Conversations with work due now for this process and no live lease. Work armed
    /// by another process becomes due here `handoff` later than for its owner, which
    /// is woken in-process: processes do not race for every timer, yet a dead
    /// owner's work is picked up.
    async fn due_work(&self, query: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError>;

    /// Claim a lease by compare-and-swap: succeeds only if the lease is free or
    /// expired, and then bumps the fencing token. `None`: someone else holds it.
    async fn claim_lease(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        ttl: std::time::Duration,
        now: Timestamp,
    ) -> Result<Option<Lease>, StoreError>;

    /// Extend a lease this process holds. `Err(LeaseLost)` if it expired or was taken.
    async fn renew_lease(
        &self,
        lease: &Lease,
        ttl: std::time::Duration,
        now: Timestamp,
    ) -> Result<Lease, StoreError>;

    /// Give a lease back so another process can claim it at once, and record
    /// `last_sent` (the last part the holder delivered) in the same transaction. A
    /// lease already lost is left alone; `last_sent` is recorded all the same.
    async fn release_lease(
        &self,
        lease: &Lease,
        last_sent: Option<PartSent>,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Claim a conversation's lease for a round (the compare-and-swap of
    /// [`Store::claim_lease`]) and read, in the same transaction, what the round works
    /// on: the batch (as [`Store::collect`]) and the outbox rows owed (as
    /// [`Store::due_outbox`]). `None`: another process holds the lease.
    /// Reservations of earlier leases on the conversation that were never settled
    /// (their round abandoned: lease lost, stop, crash) are given back in the same
    /// transaction, each on the day it was made.
    /// The timer's due time and the rows' creation times are on the caller's timeline
    /// (a backend that keeps time on its own clock translates them), so the round
    /// compares them with its own clock.
    async fn claim_round(
        &self,
        conversation: ConversationId,
        holder: &HolderId,
        ttl: std::time::Duration,
        history: usize,
        now: Timestamp,
    ) -> Result<Option<Claimed>, StoreError>;

    /// Read the conversation's version, pending messages, recent history and timer in
    /// one snapshot.
    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError>;

    /// The final check and commit, in one transaction: lease still ours and version
    /// still `batch.v0` (or the cap reached) → store the reply, mark the batch
    /// answered, delete the timer unless a newer message re-armed it. A reply the cap
    /// forces out covers only the collected messages not edited since (an edit makes
    /// a message pending again, to be answered with its new text); if every one was
    /// edited, the reply is stale.
    async fn commit_reply(
        &self,
        lease: &Lease,
        batch: &Batch,
        reply: NewReply,
        now: Timestamp,
    ) -> Result<CommitOutcome, StoreError>;

    /// Give up on a batch the model cannot answer (too long even when cut, or a
    /// request the server refuses), in one transaction under the lease (holder, token
    /// and expiry checked with the writes, as in [`Store::commit_reply`]): store
    /// `notice` as an outbox row that covers every message still pending up to
    /// `batch.v0` (recorded in `reply_covers`, so receivers and the invariant checker
    /// see which messages it answered), set `answered_version = v0`, and delete the
    /// timer unless a newer message armed it (then it is re-armed for the messages
    /// still pending). No duplicate: a message already covered is not covered again.
    /// The notice never enters the model's history. `None`: nothing was pending up to
    /// `v0`, and nothing was stored.
    async fn give_up(
        &self,
        lease: &Lease,
        batch: &Batch,
        notice: &str,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError>;

    /// Store the transcript of a pending message's voice note or audio, in one
    /// transaction under the lease (holder, token and expiry checked with the write:
    /// a replaced holder's transcript is refused with `LeaseLost`). Stored once: a
    /// message that has a transcript keeps it, so nothing is transcribed twice, even
    /// after a crash. `false`: it already had one.
    async fn store_transcript(
        &self,
        lease: &Lease,
        message: i64,
        transcript: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Delete the timer of a conversation with nothing pending at `v0` (under lease).
    async fn disarm_idle_timer(
        &self,
        lease: &Lease,
        v0: Version,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// A generation failed: push the timer to `retry_at` and count the attempt (under
    /// lease). Returns the number of consecutive failed attempts.
    async fn record_failure(
        &self,
        lease: &Lease,
        retry_at: Timestamp,
        now: Timestamp,
    ) -> Result<u32, StoreError>;

    /// Outbox rows of a conversation that are due for delivery, oldest first.
    async fn due_outbox(
        &self,
        conversation: ConversationId,
        now: Timestamp,
    ) -> Result<Vec<OutboxRow>, StoreError>;

    /// Record that the first `parts_sent` parts of a row were delivered; with `done`
    /// the row is sent. A fact, not a decision: never fenced, never goes backwards.
    async fn mark_sent(
        &self,
        id: OutboxId,
        parts_sent: u32,
        done: bool,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// A delivery attempt failed: count it and keep its error, and try again at
    /// `retry_at` (not before). Recorded before the next attempt, so a crash forgets no
    /// attempt. A sent or given-up row is left alone.
    async fn defer_outbox(
        &self,
        id: OutboxId,
        retry_at: Timestamp,
        error: &str,
    ) -> Result<(), StoreError>;

    /// A delivery attempt failed and the row is given up (dead-lettered: the platform
    /// refused it, or it kept failing past its deadline): count the attempt, keep its
    /// error, set `failed_at`; it is never tried again. A sent row is left alone.
    async fn fail_outbox(
        &self,
        id: OutboxId,
        error: &str,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Whether a conversation has nothing left to do: no pending message, no timer, no
    /// undelivered outbox row. `None` if the conversation does not exist.
    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError>;

    /// Conversations of `platform` whose last stored message arrived at or after
    /// `since`, most recently active first, at most `limit`. Each carries the platform
    /// id of the message stored last, so an adapter can read back what it missed.
    async fn recent_conversations(
        &self,
        platform: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RecentConversation>, StoreError>;

    /// How many conversations have messages waiting for a reply.
    async fn pending_conversations(&self) -> Result<u64, StoreError>;

    /// Rate limit, right after a message of `user_id` was stored (or edited) in
    /// `conversation`: count the user's messages and applied edits on the
    /// conversation's platform within the `rate` window before `now` (the one just
    /// stored included; an edit counts as a message, since it makes the batch stale as
    /// a new message does), and if there are more than
    /// `rate.max`, hold the conversation's timer until the window has room again (the
    /// oldest message past the limit leaves it). A hold already in force is kept, not
    /// extended, so held messages are answered together when it ends; later messages,
    /// `/reset` and a forced commit re-arm the timer no sooner. One transaction; `None`
    /// when the user is within the limit (or nothing is pending any more).
    async fn hold_over_rate(
        &self,
        conversation: ConversationId,
        user_id: &str,
        rate: RateWindow,
        now: Timestamp,
    ) -> Result<Option<RateHold>, StoreError>;

    /// Charge tokens under a conversation's lease, in one transaction that checks
    /// the lease like the final check (holder, token, expiry): every scope of
    /// `charge` is added to, or none is. A scope with a limit that the charge would
    /// pass (its positive tokens on top of what it used that day) refuses the whole
    /// charge and, with `charge.hold_until`, holds the lease's conversation timer
    /// until then. Totals change only by adding to them (never written back from a
    /// read), so concurrent charges of several processes all count. The scopes' rows
    /// are locked in one order (sorted by scope), whatever order `charge` names them
    /// in, so concurrent charges queue and never deadlock. A
    /// [`Reservation::Reserve`] that is charged is recorded under the lease's token
    /// and `charge.day`; a [`Reservation::Settle`] forgets the lease's record.
    async fn charge_tokens(
        &self,
        lease: &Lease,
        charge: &TokenCharge,
        now: Timestamp,
    ) -> Result<Charged, StoreError>;

    /// Tokens each of `scopes` used on `day` (0 for a scope with none), in order.
    async fn token_usage(&self, day: &str, scopes: &[String]) -> Result<Vec<u64>, StoreError>;

    /// Record an admin's run-time access decision (`/allow`, `/deny`), replacing any
    /// earlier one for the same subject. Every process sees it on its next read.
    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError>;

    /// Every run-time access decision, oldest first.
    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError>;

    /// Whether the database can do its work (for health checks): it answers a read of
    /// its tables, and no recent operation found it damaged, full or unwritable.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A clean stop's last step, once nothing writes any more: make what the database
    /// holds complete without side files. SQLite: every write queued before this call
    /// is committed first, then the write-ahead log is checkpointed into the main file
    /// and truncated (`PRAGMA wal_checkpoint(TRUNCATE)`), so a copy of `lull.db` alone
    /// (without `-wal` and `-shm`) has everything until the next write. `Busy`: another
    /// process still reads or writes the file, and the log keeps what it holds.
    /// PostgreSQL: nothing to do (the server keeps its own files). The store stays
    /// usable; a write after it goes to the log again.
    async fn checkpoint(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Woken when a timer may have been armed by another process (a backend shared
    /// across hosts announces every armed timer), so the scheduler looks for due work
    /// at once instead of at its next poll. `None` (SQLite): other processes' timers
    /// are found by the poll alone; this process's own wake it in-process.
    fn wake_ups(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::DatabaseUrl;
    use secrecy::ExposeSecret;

    #[test]
    fn database_urls_name_a_backend_or_fail_naming_the_variable() {
        assert!(matches!(
            DatabaseUrl::parse("sqlite:data/lull.db"),
            Ok(DatabaseUrl::Sqlite(path)) if path == std::path::Path::new("data/lull.db")
        ));
        for url in [
            "postgres://lull:s%40cret@db.internal:5432/lull?sslmode=require",
            "postgresql://db.internal/lull",
        ] {
            assert!(
                matches!(DatabaseUrl::parse(url), Ok(DatabaseUrl::Postgres(_))),
                "{url}"
            );
        }
        for bad in [
            "mysql://x/y",
            "postgres://",
            "postgres://db/lull?sslmode=sometimes",
            "lull.db",
            "sqlite:",
            "",
        ] {
            let error = DatabaseUrl::parse(bad).unwrap_err();
            assert!(error.contains("DATABASE_URL"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_postgres_password_is_never_shown_and_is_known_for_redaction() {
        let url =
            DatabaseUrl::parse("postgres://lull:s%40cret@db.internal:5432/lull?sslmode=require")
                .unwrap();
        assert!(!url.shown().contains("cret"), "{}", url.shown());
        assert!(!format!("{url:?}").contains("cret"));
        assert_eq!(url.password().unwrap().expose_secret(), "s@cret");
        // Percent-decoded and nothing else: `+`, `=` and `&` are themselves.
        for (url, password) in [
            ("postgres://lull:a+b=c&d%40e%2B@db/lull", "a+b=c&d@e+"),
            ("postgres://lull:%2B%3D%26@db/lull", "+=&"),
            ("postgres://lull@db/lull?password=p%26q+r", "p&q+r"),
        ] {
            let found = DatabaseUrl::parse(url).unwrap().password();
            assert_eq!(
                found.as_ref().map(ExposeSecret::expose_secret),
                Some(password),
                "{url}"
            );
        }
        assert!(
            DatabaseUrl::parse("postgres://db/lull")
                .unwrap()
                .password()
                .is_none()
        );
    }
}
