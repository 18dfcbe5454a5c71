//! The overheard area of the contract: group context (`LULL_GROUP_CONTEXT`). In an
//! admitted group, the recent messages not addressed to lull are kept beside the
//! conversation, bounded, and shown to the model when lull is addressed. They are
//! never messages to answer: storing one bumps no version and arms no timer.

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, Said, Timestamp};
use crate::store::StoreError;

/// A group message not addressed to lull, as the adapter passed it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverheardMessage {
    pub conversation: ConversationRef,
    /// The platform's message id: a redelivery is kept once.
    pub message_id: String,
    /// Who wrote it (`/forgetme` deletes theirs).
    pub user_id: String,
    pub author: String,
    pub text: String,
}

/// `message` to keep, with at most `keep` of its conversation
/// ([`OverheardStore::overhear`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overhearing {
    pub message: OverheardMessage,
    pub keep: usize,
    pub now: Timestamp,
}

/// The newest `limit` overheard messages of `conversation`
/// ([`OverheardStore::overheard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverheardQuery {
    pub conversation: ConversationId,
    pub limit: usize,
}

/// Overheard messages: at most `keep` per conversation, the newest.
#[async_trait]
pub trait OverheardStore: Send + Sync + 'static {
    /// Keep `message` and delete, in the same write, what falls beyond the newest
    /// `keep` of its conversation. `false` for a redelivery (kept once). Never
    /// touches the conversation's version, timer or lease.
    async fn overhear(&self, overhearing: Overhearing) -> Result<bool, StoreError>;

    /// The newest `limit` overheard messages of a conversation, oldest first, with
    /// their authors. `/reset` (`MessageStore::reset_context`) forgets them.
    async fn overheard(&self, query: OverheardQuery) -> Result<Vec<Said>, StoreError>;
}
