//! The messages area of the contract: what ingest stores and adapters read back.

use async_trait::async_trait;
use lull_port::Media;

use crate::domain::{ConversationId, ConversationRef, HolderId, Platform, Timestamp, Version};
use crate::store::{RecentConversation, StoreError};
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

/// The process a message is stored by, and when: the timer the store arms for it is
/// due for `holder` ([`MessageStore::edit`]).
#[derive(Debug, Clone, Copy)]
pub struct StoredBy<'a> {
    pub holder: &'a HolderId,
    pub now: Timestamp,
}

/// `/reset` of `conversation` ([`MessageStore::reset_context`]), taken by the process
/// `holder`: the timer is armed due now for it. `is_group` describes the
/// conversation should the reset be its first write.
#[derive(Debug, Clone, Copy)]
pub struct ContextReset<'a> {
    pub conversation: &'a ConversationRef,
    pub is_group: bool,
    pub holder: &'a HolderId,
    pub now: Timestamp,
}

/// What [`MessageStore::reset_context`] did: the conversation's row and the version the
/// reset moved it to (a round in flight at an older `v0` is stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextWasReset {
    pub conversation: ConversationId,
    pub version: Version,
}

/// Conversations of `platform` active at or after `since`, at most `limit` of them
/// ([`MessageStore::recent_conversations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecentQuery {
    pub platform: Platform,
    pub since: Timestamp,
    pub limit: usize,
}

/// Messages: what ingest stores (messages, edits, a fresh context) and what adapters read
/// back to catch up.
#[async_trait]
pub trait MessageStore: Send + Sync + 'static {
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
    /// [`LimitStore::hold_over_rate`](crate::store::LimitStore::hold_over_rate)). Edits of answered or unknown messages, and edits
    /// that change nothing, are ignored (and not counted).
    async fn edit(&self, edit: MessageEdit, by: StoredBy<'_>) -> Result<IngestOutcome, StoreError>;

    /// Start a fresh context: earlier exchanges are kept but no longer offered as
    /// history. Pending messages are kept and answered in the fresh context, at once:
    /// the timer's failure backoff is cleared and it is due now for `holder` (the
    /// process that took the command), so `/reset` always unsticks a conversation;
    /// but not before a limit's hold ends ([`LimitStore::hold_over_rate`](crate::store::LimitStore::hold_over_rate),
    /// [`LimitStore::charge_tokens`](crate::store::LimitStore::charge_tokens)): it is no way around a limit.
    /// The group context kept beside the conversation (overheard messages) is forgotten
    /// in the same transaction.
    ///
    /// Fresh: the reset moves the conversation's version like every control, and the
    /// pending messages take the new version, so a generation in flight (its reply
    /// written from the history the reset forgot) fails its final check, even a commit
    /// the cap forces (it covers only messages unchanged since it collected them).
    async fn reset_context(&self, reset: ContextReset<'_>) -> Result<ContextWasReset, StoreError>;

    /// Conversations of `platform` whose last stored message arrived at or after
    /// `since`, most recently active first, at most `limit`. Each carries the platform
    /// id of the message stored last, so an adapter can read back what it missed: the
    /// last by row id (no loss: catch-up resumes after it), never one that merely has a
    /// larger platform id.
    async fn recent_conversations(
        &self,
        query: RecentQuery,
    ) -> Result<Vec<RecentConversation>, StoreError>;
}
