//! The outbox area of the contract: rows waiting for delivery, and delivery facts.

use async_trait::async_trait;
use lull_port::QuickReply;

use crate::domain::{ConversationId, ConversationRef, HolderId, OutboxId, Timestamp};
use crate::store::{OutboxKind, PartSent, StoreError};
/// A notice is an outbox row that answers no message: help text, a "text only" hint,
/// an access denial, a failure notice. It never enters the model's history.
#[derive(Debug, Clone)]
pub struct NewNotice {
    pub conversation: ConversationRef,
    pub is_group: bool,
    pub text: String,
    pub reply_to: Option<String>,
    /// The answers it offers as buttons under its last part, decided with its text
    /// and stored with it: delivery shows what was stored, never reads the text.
    pub quick_replies: Vec<QuickReply>,
    /// At most one notice per key is ever stored, so a redelivered command or a
    /// repeated failure does not notify twice.
    pub dedupe_key: String,
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
    /// give-up ([`RoundStore::give_up`](crate::store::RoundStore::give_up)) ended (empty for other notices).
    pub covers: Vec<String>,
    /// The answers a notice offers as buttons under its last part, as it was stored
    /// (empty for a reply).
    pub quick_replies: Vec<QuickReply>,
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

/// A conversation as of a time: what is due or open in it at `now` (on the caller's
/// timeline, as every time a method is given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationAt {
    pub conversation: ConversationId,
    pub now: Timestamp,
}

/// A notice to queue ([`OutboxStore::enqueue_notice`]) by the process `holder`.
#[derive(Debug, Clone)]
pub struct Enqueue<'a> {
    pub notice: NewNotice,
    pub holder: &'a HolderId,
    pub now: Timestamp,
}

/// A failed delivery attempt to retry ([`OutboxStore::defer_outbox`]): not before
/// `retry_at`, on the timeline of `now`.
#[derive(Debug, Clone, Copy)]
pub struct OutboxDeferral<'a> {
    pub id: OutboxId,
    pub retry_at: Timestamp,
    pub error: &'a str,
    pub now: Timestamp,
}

/// A failed delivery attempt that gives the row up ([`OutboxStore::fail_outbox`]).
#[derive(Debug, Clone, Copy)]
pub struct OutboxFailure<'a> {
    pub id: OutboxId,
    pub error: &'a str,
    pub now: Timestamp,
}

/// The outbox: rows waiting for delivery (replies and notices), and the facts of their
/// delivery.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// Queue a notice for delivery, at most once per dedupe key. Returns the row if it
    /// was queued now (`None`: an earlier one with that key exists).
    async fn enqueue_notice(&self, queue: Enqueue<'_>) -> Result<Option<OutboxRow>, StoreError>;

    /// Outbox rows of a conversation that are due for delivery, oldest first.
    async fn due_outbox(&self, at: ConversationAt) -> Result<Vec<OutboxRow>, StoreError>;

    /// Record that the first `parts_sent` parts of a row were delivered; with `done`
    /// the row is sent. A fact, not a decision: never fenced, never goes backwards.
    async fn mark_sent(&self, sent: PartSent, now: Timestamp) -> Result<(), StoreError>;

    /// A delivery attempt failed: count it and keep its error, and try again at
    /// `retry_at` (not before). Recorded before the next attempt, so a crash forgets no
    /// attempt. A sent or given-up row is left alone. `retry_at` is on the timeline of
    /// the caller's `now`, as every time a method is given.
    async fn defer_outbox(&self, deferral: OutboxDeferral<'_>) -> Result<(), StoreError>;

    /// A delivery attempt failed and the row is given up (dead-lettered: the platform
    /// refused it, or it kept failing past its deadline): count the attempt, keep its
    /// error, set `failed_at`; it is never tried again. A sent row is left alone.
    async fn fail_outbox(&self, failure: OutboxFailure<'_>) -> Result<(), StoreError>;
}
