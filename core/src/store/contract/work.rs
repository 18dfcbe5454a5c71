//! The work area of the contract: what a process asks of the whole database.

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, HolderId, Platform, Timestamp};
use crate::store::StoreError;
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

/// Work: what a process asks of the whole database, not of one conversation under a lease:
/// which conversations need a round, whether one is settled, the pending gauge, and the
/// database itself (its health, its clean stop, its wake-ups).
#[async_trait]
pub trait WorkStore: Send + Sync + 'static {
    /// Conversations with work due now for this process and no live lease. Work armed
    /// by another process becomes due here `handoff` later than for its owner, which
    /// is woken in-process: processes do not race for every timer, yet a dead
    /// owner's work is picked up.
    async fn due_work(&self, query: &WorkQuery, now: Timestamp) -> Result<DueWork, StoreError>;

    /// Whether a conversation has nothing left to do: no pending message, no timer, no
    /// undelivered outbox row. `None` if the conversation does not exist.
    async fn is_settled(&self, conversation: &ConversationRef) -> Result<Option<bool>, StoreError>;

    /// Whether a conversation's messages wait for a reply: a message not yet answered
    /// or a timer armed (what `/status` calls waiting). Unlike [`WorkStore::is_settled`],
    /// an undelivered notice (the answer to a command) is not waiting. `false` for an
    /// unknown conversation.
    async fn awaits_reply(&self, conversation: &ConversationRef) -> Result<bool, StoreError>;

    /// How many conversations have messages waiting for a reply.
    async fn pending_conversations(&self) -> Result<u64, StoreError>;

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
