//! The reactions area of the contract: which message of a pending burst carries lull's
//! ack reaction, so that it is set once per burst whichever process stored the
//! messages, and cleared once, by whoever delivers the reply covering it.

use async_trait::async_trait;

use crate::domain::ConversationId;
use crate::store::StoreError;

/// The ack on the pending message `message_id` of `conversation`
/// ([`ReactionStore::claim_ack`], [`ReactionStore::ack_open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckOf<'a> {
    pub conversation: ConversationId,
    pub message_id: &'a str,
}

/// The acks carried by `covers`, the platform message ids a reply of `conversation`
/// covers ([`ReactionStore::take_acks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcksCovered<'a> {
    pub conversation: ConversationId,
    pub covers: &'a [String],
}

/// Acks: one row per burst whose ack reaction was set and not yet cleared.
///
/// A burst is the messages pending after one `answered_version`: the claim is unique
/// on (conversation, that version), so two processes storing messages of one burst
/// at once claim it once between them. A row is taken when the reply covering its
/// message was delivered (or given up).
#[async_trait]
pub trait ReactionStore: Send + Sync + 'static {
    /// Claim the ack of the burst message `message_id` is pending in: `true` for
    /// exactly one message per burst (the first claim to commit, on any process);
    /// `false` when another message of the burst carries it, or the message is no
    /// longer pending (already answered: no reaction is owed).
    async fn claim_ack(&self, ack: AckOf<'_>) -> Result<bool, StoreError>;

    /// Whether the ack on `message_id` is still claimed and not taken: a process that
    /// just set the reaction clears it again at once when the reply overtook it.
    async fn ack_open(&self, ack: AckOf<'_>) -> Result<bool, StoreError>;

    /// Take the acks carried by `covers` (the platform message ids a reply covers):
    /// each row is deleted and returned once, to one caller, which clears the
    /// reaction.
    async fn take_acks(&self, covered: AcksCovered<'_>) -> Result<Vec<String>, StoreError>;
}
