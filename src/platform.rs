//! The contract between the core and the platform adapters.
//!
//! Adapters translate: platform updates become [`Incoming`] (handed to
//! [`crate::dispatcher::Dispatcher::ingest`]) and the dispatcher's deliveries reach
//! the platform through [`Outbound`]. Platform types (teloxide, serenity, JSON bodies)
//! never cross into the core, and adapters hold no conversation logic.

use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::dispatcher::Dispatcher;
use crate::domain::{ConversationRef, OutboxId, Platform, Timestamp};
use crate::health::Health;
use crate::store::OutboxKind;

/// What a user sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Text (for media, the caption). Commands are text too.
    Text(String),
    /// A message lull cannot read (sticker, voice, a file without caption). The
    /// string names it for the user ("sticker").
    Unsupported(String),
}

/// Whether an update is a new message or a change to an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncomingKind {
    New,
    Edit,
}

/// One inbound update, translated by an adapter.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub conversation: ConversationRef,
    /// Group chats get author names in the prompt and replies that quote.
    pub is_group: bool,
    /// The platform's user id (what `LULL_ALLOWED_USERS` lists).
    pub user_id: String,
    /// The user's display name.
    pub author: String,
    /// The platform's message id, unique within the conversation. Redeliveries carry
    /// the same id and are stored once.
    pub message_id: String,
    pub content: Content,
    pub kind: IncomingKind,
}

/// One part of an outbox row, ready to send. Parts are numbered so a delivery
/// interrupted by a crash resumes at the first unsent part.
#[derive(Debug, Clone)]
pub struct OutgoingPart<'a> {
    pub conversation: &'a ConversationRef,
    /// Stable across retries: webhooks get it as `reply_id`, Discord derives its nonce
    /// from it and `index`.
    pub outbox_id: OutboxId,
    /// When the outbox row was committed. With `outbox_id` it names the row across
    /// retries and processes, and not again in another database (a webhook's
    /// `webhook-id` is made of both).
    pub created_at: Timestamp,
    pub kind: OutboxKind,
    pub index: usize,
    pub count: usize,
    pub text: &'a str,
    /// The platform message id to quote (the last message of the batch), if any.
    pub reply_to: Option<&'a str>,
    /// Platform message ids the reply covers (empty for notices).
    pub covers: &'a [String],
}

/// Why a send failed, as far as retrying is concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The platform asked us to wait (HTTP 429 with a retry hint).
    #[error("rate limited; retry after {0:?}")]
    RetryAfter(Duration),
    /// A network error or a server error: worth retrying with backoff.
    #[error("temporary failure: {0}")]
    Transient(String),
    /// The platform refused the message (blocked by the user, chat gone, malformed):
    /// retrying cannot help.
    #[error("refused: {0}")]
    Permanent(String),
}

/// The sending half of an adapter.
#[async_trait]
pub trait Outbound: Send + Sync + 'static {
    fn platform(&self) -> Platform;

    /// Split a text into the parts the platform accepts, in order. Must be
    /// deterministic: delivery resumes by part index after a crash.
    fn split(&self, text: &str) -> Vec<String>;

    /// Send one part. Retries are the caller's job: this makes one attempt, and returns
    /// within the platform's own time limit. The caller may drop the future at any
    /// await (lease lost, shutdown): the part then counts as not sent.
    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError>;

    /// Show "typing…" in a conversation. Best effort.
    async fn typing(&self, conversation: &ConversationRef) -> Result<(), SendError>;

    /// How often to repeat [`Outbound::typing`] while the model works (the platform's
    /// indicator lapses after a while); `None` if the platform has none.
    fn typing_every(&self) -> Option<Duration>;

    /// How long after its commit a reply that keeps failing (errors, timeouts, rate
    /// limits) is given up and dead-lettered. `None`: it is retried until it goes
    /// through or the platform refuses it ([`SendError::Permanent`]).
    fn max_age(&self) -> Option<Duration> {
        None
    }
}

/// The receiving half of an adapter: connects to its platform and feeds every update
/// to the dispatcher until `shutdown` fires. It reports its connection state through
/// `health` and acknowledges an update to its platform only after
/// [`Dispatcher::ingest`] returned `Ok` (stored), so nothing is lost to a crash.
#[async_trait]
pub trait Inbound: Send + 'static {
    fn platform(&self) -> Platform;

    async fn run(
        self: Box<Self>,
        dispatcher: Arc<Dispatcher>,
        health: Health,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()>;
}
