//! The memories area of the contract: what the model was asked to remember, as rows.
//!
//! **Rows, never a whole written back.** A memory is one row of its scope — a person
//! on a platform, or one chat — keyed by (scope, platform, owner), so a later "several
//! bots in one instance" adds one column here. Remembering inserts a row, forgetting
//! deletes one; no method reads a scope's list and writes it back, so two rounds
//! remembering for one person at once both keep their fact.
//!
//! **Written with the reply, or not at all.** What a round's tools stage
//! ([`MemoryWrites`]) is applied inside the reply's final-check transaction
//! ([`RoundStore::commit_reply`](crate::store::RoundStore::commit_reply)): a round
//! dropped as stale, stopped or whose lease was lost writes nothing. The commands
//! (`/memory forget N`, `/memory clear`, `/forgetme`) change rows directly, one
//! statement each.

use async_trait::async_trait;
use lull_port::Platform;

use crate::domain::{ConversationRef, Timestamp};
use crate::store::StoreError;

/// The most memories one scope keeps: remembering beyond it drops the oldest.
pub const MEMORIES_PER_SCOPE: usize = 200;
/// The most characters one memory holds.
pub const MEMORY_MAX_CHARS: usize = 500;

/// Whose memory it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    /// A person on one platform, in any private chat of theirs with the bot. Never
    /// shown in a group.
    Person,
    /// One chat (a group, a topic, a channel): shown there only.
    Chat,
}

impl ScopeKind {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::Person => "person",
            ScopeKind::Chat => "chat",
        }
    }

    /// The kind of a stored form.
    pub fn parse(stored: &str) -> Option<ScopeKind> {
        match stored {
            "person" => Some(ScopeKind::Person),
            "chat" => Some(ScopeKind::Chat),
            _ => None,
        }
    }
}

/// One scope: a person (`owner` is their user id) or a chat (`owner` is the
/// conversation's key), on a platform.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub kind: ScopeKind,
    pub platform: Platform,
    pub owner: String,
}

impl Scope {
    /// The person `user_id` of `platform`.
    pub fn person(platform: Platform, user_id: &str) -> Scope {
        Scope {
            kind: ScopeKind::Person,
            platform,
            owner: user_id.to_owned(),
        }
    }

    /// The chat `conversation`.
    pub fn chat(conversation: &ConversationRef) -> Scope {
        Scope {
            kind: ScopeKind::Chat,
            platform: conversation.platform,
            owner: conversation.key.clone(),
        }
    }
}

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    pub id: i64,
    pub scope: Scope,
    pub text: String,
    /// Who asked for it (a user id of the scope's platform).
    pub author: String,
    /// The platform message id of the batch it was remembered from, if any.
    pub source: Option<String>,
    pub created_at: Timestamp,
    /// Grows with every change of the row (a merge's compare-and-swap reads it).
    pub version: i64,
}

/// A memory to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remember {
    pub scope: Scope,
    /// At most [`MEMORY_MAX_CHARS`] characters, not blank (checked by whoever stages it).
    pub text: String,
    pub author: String,
    pub source: Option<String>,
}

/// One change a round stages for its reply's commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryChange {
    /// Insert a row, unless the scope already holds this exact text, or a clear of its
    /// scope or an erase of its author fenced the round out
    /// ([`MemoryWrites::newest_message`]); then drop the scope's oldest beyond
    /// [`MEMORIES_PER_SCOPE`].
    Remember(Remember),
    /// Delete row `id`, only if it belongs to `scope` (an id of another scope is left).
    Forget { scope: Scope, id: i64 },
}

/// What a round's tools staged, committed with its reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryWrites {
    /// In the order they were asked.
    pub changes: Vec<MemoryChange>,
    /// The row id of the batch's newest message: a clear of a scope (or an erase of an
    /// author) made after it was stored fences the round's facts out
    /// ([`MemoryStore::clear_memories`], [`MemoryStore::erase_person`]).
    pub newest_message: i64,
    /// The memories the round read for its prompt. Only the counter-test's switch
    /// (`LULL_TEST_MEMORY_WRITE_BACK`) uses it: it writes this list back whole with
    /// the new rows, as the peers' memory files do, and so loses what others added.
    pub seen: Vec<Memory>,
}

impl MemoryWrites {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// What a commit's [`MemoryWrites`] did (small counts: it rides in every
/// [`CommitOutcome::Committed`](crate::store::CommitOutcome::Committed)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryApplied {
    /// Rows inserted.
    pub remembered: u16,
    /// Rows deleted by `Forget`.
    pub forgotten: u16,
    /// Oldest rows dropped beyond [`MEMORIES_PER_SCOPE`].
    pub dropped: u16,
    /// Facts not written: their scope was cleared, or their author erased, after the
    /// round's newest message was stored.
    pub fenced: u16,
}

/// What `/forgetme` erased.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Erased {
    /// Memory rows deleted (the person's own, and the chat memories they asked for).
    pub memories: u64,
    /// Messages whose text, transcript and media were replaced by a tombstone.
    pub messages: u64,
    /// Overheard group messages deleted.
    pub overheard: u64,
    /// Summaries deleted: every conversation's in which the person wrote (a summary
    /// holds their words; the next is made from what is left).
    pub summaries: u64,
}

/// How many memories are stored, by scope kind (the status page: counts, no texts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryCounts {
    pub person: u64,
    pub chat: u64,
}

/// Memories as rows of their scope.
#[async_trait]
pub trait MemoryStore: Send + Sync + 'static {
    /// The memories of `scopes`, newest first, at most `limit`.
    async fn memories(&self, scopes: &[Scope], limit: usize) -> Result<Vec<Memory>, StoreError>;

    /// Delete memory `id` if it belongs to `scope`; `false`: there is no such memory
    /// there (another scope's id is never touched).
    async fn forget_memory(&self, scope: &Scope, id: i64) -> Result<bool, StoreError>;

    /// Delete every memory of `scope`; how many. In the same transaction, fence the
    /// rounds in flight: a fact a round stages for `scope` is not written when its
    /// newest message was stored before this clear (a cleared memory never comes back
    /// from a reply written on the old picture).
    async fn clear_memories(&self, scope: &Scope) -> Result<u64, StoreError>;

    /// `/forgetme`, in one transaction: delete the person's own memories and the chat
    /// memories they asked for, tombstone the text of every message they sent on
    /// `platform` (text, transcript and media emptied, `erased_at` set; the row, its
    /// version and what covers it stay, so counters and replies are intact), and
    /// delete their overheard group messages and the summaries of every chat they
    /// wrote in; and fence the rounds in flight, as [`MemoryStore::clear_memories`]
    /// does, for the person's scope and every fact they asked for, and the summaries
    /// being made of those chats (`SummaryStore::store_summary`: a summary whose
    /// picture was read before the erase is not stored). On SQLite the freed bytes are
    /// overwritten (`secure_delete`) and the WAL is checkpointed after it.
    async fn erase_person(
        &self,
        platform: Platform,
        user_id: &str,
        now: Timestamp,
    ) -> Result<Erased, StoreError>;

    /// How many memories are stored, by scope kind.
    async fn memory_counts(&self) -> Result<MemoryCounts, StoreError>;
}
