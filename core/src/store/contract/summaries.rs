//! The summaries area of the contract: a long conversation's summary as a derived row,
//! and retention (old texts removed, rows kept).
//!
//! **A summary never replaces a message.** A summary covers a conversation's exchanges
//! up to one reply ([`Summary::through_reply`]); the messages and replies it covers
//! stay as they are. A round is shown the summary, then the exchanges after it
//! ([`Batch::summary`](crate::store::Batch::summary)). One row per conversation (a
//! later bot column keys it with the conversation).
//!
//! **Under a lease that expires; only if it covers more.** A summary is made under the
//! conversation's summary lease ([`LeaseKey::Summary`](crate::domain::LeaseKey)) and
//! stored by [`SummaryStore::store_summary`] in one transaction that checks the lease
//! (a maker that lost it stores nothing), the context (a `/new` since the picture was
//! read: nothing), and the coverage (a summary covering no more than the stored one:
//! nothing). A message that arrives meanwhile is simply after the summary.
//!
//! **Retention removes texts, not rows.** [`SummaryStore::expire_texts`] removes the
//! texts of answered messages and delivered replies older than a moment, a batch at a
//! time, under the retention lease; a pending message, an undelivered row, a summary
//! and a memory are never touched by it.

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, Exchange, Lease, Timestamp, TokenUsage};
use crate::store::StoreError;

/// A conversation's summary as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The outbox id of the newest reply it covers: it covers that exchange and every
    /// earlier one since the reset it was made after.
    pub through_reply: i64,
    /// The newest message row it covers.
    pub through_message: i64,
    /// When that message arrived.
    pub through_at: Timestamp,
    /// How many messages it covers in all (with those its predecessors covered).
    pub messages: u64,
    pub text: String,
    /// The model that wrote it.
    pub model: String,
    pub created_at: Timestamp,
}

/// One exchange a summary may cover, as [`SummaryStore::summary_picture`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoverableExchange {
    /// The reply's outbox id.
    pub reply: i64,
    /// The newest message the reply covered, and when it arrived.
    pub newest_message: i64,
    pub newest_at: Timestamp,
    pub exchange: Exchange,
}

/// What a summary's maker reads, in one snapshot: the context it is made in, the
/// stored summary of that context (if any), and the exchanges after it, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryPicture {
    /// The conversation's context version (the last `/new`): the summary is stored
    /// only while it is still this.
    pub context_version: i64,
    pub previous: Option<Summary>,
    /// The delivered replies after `previous` with the messages each covered, oldest
    /// first, at most the limit asked for. A reply whose text retention removed is
    /// left out.
    pub exchanges: Vec<CoverableExchange>,
}

/// A summary to store ([`SummaryStore::store_summary`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSummary {
    pub conversation: ConversationId,
    /// The picture's context version.
    pub context_version: i64,
    pub through_reply: i64,
    pub through_message: i64,
    pub through_at: Timestamp,
    pub messages: u64,
    pub text: String,
    pub model: String,
    pub usage: Option<TokenUsage>,
    /// The newest message row the picture held (kept exchanges included): only the
    /// counter-test's write-back reads it (`LULL_TEST_SUMMARY_WRITE_BACK`, the peers'
    /// history saved back trimmed over whatever arrived after it).
    pub picture_newest_message: i64,
}

/// What [`SummaryStore::store_summary`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryStored {
    /// Stored: the conversation's rounds are shown it from now on.
    Stored,
    /// The stored summary already covers as much or more: nothing stored.
    Superseded,
    /// The maker's summary lease was lost (expired and taken), or a `/forgetme` of
    /// someone who wrote in the chat came after its picture was read: nothing stored.
    Fenced,
    /// The conversation was reset (`/new`) since the picture: nothing stored.
    Reset,
}

impl SummaryStored {
    /// The `outcome` label of `lull_summaries_total`.
    pub fn outcome(self) -> &'static str {
        match self {
            SummaryStored::Stored => "stored",
            SummaryStored::Superseded => "superseded",
            SummaryStored::Fenced => "fenced",
            SummaryStored::Reset => "reset",
        }
    }
}

/// What one retention batch removed ([`SummaryStore::expire_texts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Messages whose text, transcript and media were removed.
    pub messages: u64,
    /// Delivered replies and notices whose text was removed.
    pub replies: u64,
    /// Group-context rows deleted.
    pub overheard: u64,
}

impl Expired {
    pub fn total(self) -> u64 {
        self.messages + self.replies + self.overheard
    }
}

/// One retention batch ([`SummaryStore::expire_texts`]).
#[derive(Debug, Clone, Copy)]
pub struct Expiry<'a> {
    /// The retention lease.
    pub lease: &'a Lease,
    /// Texts older than this go.
    pub before: Timestamp,
    /// The most rows of each kind removed in this batch.
    pub batch: u32,
    pub now: Timestamp,
}

/// Summaries and retention.
#[async_trait]
pub trait SummaryStore: Send + Sync + 'static {
    /// What a summary of `conversation` would be made from, in one snapshot: the
    /// context version, the stored summary of that context, and at most `limit`
    /// exchanges after it, oldest first.
    async fn summary_picture(
        &self,
        conversation: ConversationId,
        limit: usize,
    ) -> Result<SummaryPicture, StoreError>;

    /// Store `summary` under `lease` (the conversation's summary lease), in one
    /// transaction: [`SummaryStored::Fenced`] unless the lease is still the maker's
    /// and no `/forgetme` fenced the conversation after its picture was read,
    /// [`SummaryStored::Reset`] if the conversation's context moved since the picture,
    /// [`SummaryStored::Superseded`] unless it covers more than the stored summary of
    /// that context; else it replaces that row. Nothing else is written: no message or
    /// reply is touched.
    async fn store_summary(
        &self,
        lease: &Lease,
        summary: &NewSummary,
        now: Timestamp,
    ) -> Result<SummaryStored, StoreError>;

    /// The summary `conversation`'s rounds are shown now (of its current context);
    /// `None` for a conversation never stored.
    async fn summary(&self, conversation: &ConversationRef) -> Result<Option<Summary>, StoreError>;

    /// Remove, under the retention lease (`Err(LeaseLost)` without it), the texts of
    /// at most `batch` answered messages (their version at or before their
    /// conversation's answered version) received before `before`, of at most `batch`
    /// delivered outbox rows sent before it, and delete at most `batch` group-context
    /// rows received before it; oldest first. Rows stay (tombstones: `erased_at`), so
    /// counters, covers and the final check are unchanged. Never a pending message,
    /// an undelivered row, a summary or a memory.
    async fn expire_texts(&self, expiry: Expiry<'_>) -> Result<Expired, StoreError>;
}
