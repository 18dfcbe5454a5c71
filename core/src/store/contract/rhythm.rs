//! The rhythm area of the contract: each conversation's learned rhythm
//! ([`Rhythm`]), learned by every committed reply (in the commit's transaction) and
//! read by ingest to pick its wait; read back here for tests and the status.

use std::time::Duration;

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, Timestamp};
use crate::rhythm::Rhythm;
use crate::store::StoreError;

/// `user_id` typing in `conversation` at `now`: their pending messages may wait
/// `hold` longer ([`RhythmStore::extend_timer`]).
#[derive(Debug, Clone, Copy)]
pub struct Typing<'a> {
    pub conversation: &'a ConversationRef,
    pub user_id: &'a str,
    pub hold: Duration,
    pub now: Timestamp,
}

/// Rhythms: what a committed reply taught about its conversation.
#[async_trait]
pub trait RhythmStore: Send + Sync + 'static {
    /// The conversation's rhythm as stored (the default for one never answered).
    /// Every committed reply has learned from the arrival times of the messages it
    /// covers, in the transaction that stored it, so a rolled-back commit teaches
    /// nothing and a stale (dropped) reply teaches nothing until its batch is answered.
    async fn rhythm(&self, conversation: ConversationId) -> Result<Rhythm, StoreError>;

    /// `user_id` is typing in `conversation`: if a message of theirs is pending, the
    /// conversation's timer is pushed to `now + hold`, never past the cap (its oldest
    /// pending message + `max_wait`) and never earlier than it was. Returns the new due
    /// time, or `None` when no message of theirs is pending (nothing changed).
    async fn extend_timer(&self, typing: Typing<'_>) -> Result<Option<Timestamp>, StoreError>;
}
