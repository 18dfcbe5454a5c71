//! The threads area of the contract: the conversations that are threads lull opened
//! (Discord, `LULL_DISCORD_AUTO_THREAD`), where messages need no mention. Kept in the
//! database so every process, and a restarted one, knows them.

use async_trait::async_trait;

use crate::domain::{ConversationRef, Timestamp};
use crate::store::StoreError;

#[async_trait]
pub trait ThreadStore: Send + Sync + 'static {
    /// Remember `conversation` as a thread lull opened; remembering it again changes
    /// nothing.
    async fn remember_thread(
        &self,
        conversation: &ConversationRef,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Whether `conversation` is a thread lull opened.
    async fn is_thread(&self, conversation: &ConversationRef) -> Result<bool, StoreError>;
}
