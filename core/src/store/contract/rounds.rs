//! The rounds area of the contract: a conversation's round under its lease.

use async_trait::async_trait;
use lull_port::Media;

use crate::domain::{ConversationId, ConversationRef, HolderId, Lease, Timestamp, Version};
use crate::store::{
    Exchange, MemoryApplied, MemoryWrites, OutboxRow, StoreError, TokenUsage, said_text,
};
/// A stored message waiting for its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMessage {
    /// The store's row id (what `covers` records).
    pub row: i64,
    pub message_id: String,
    pub user_id: String,
    pub author: String,
    pub text: String,
    pub version: Version,
    pub received_at: Timestamp,
    /// Media references stored with the message; only the pending batch fetches them.
    pub media: Vec<Media>,
    /// The transcript of its voice note or audio, once stored ([`RoundStore::store_transcript`]).
    pub transcript: Option<String>,
}

impl PendingMessage {
    /// The text the model sees: the stored text, then the transcript, if any.
    pub fn said(&self) -> String {
        said_text(&self.text, self.transcript.as_deref())
    }
}

/// Everything a round needs to generate a reply, read in one snapshot.
#[derive(Debug, Clone)]
pub struct Batch {
    pub conversation_id: ConversationId,
    pub conversation: ConversationRef,
    pub is_group: bool,
    /// The version when collected: the reply may only be committed while the
    /// conversation is still at this version (or the cap forces it).
    pub v0: Version,
    /// Every message after `answered_version`, oldest first.
    pub pending: Vec<PendingMessage>,
    /// The most recent exchanges since the last `/reset` and after `summary`, oldest
    /// first.
    pub history: Vec<Exchange>,
    /// The conversation's summary of the exchanges before `history` (read only when
    /// the claim asked for summaries; `None` for a round with nothing pending).
    pub summary: Option<crate::store::Summary>,
    /// The conversation's timer: when it is due and how many rounds failed in a row.
    pub timer: Option<TimerState>,
}

impl Batch {
    /// When the oldest pending message arrived (the base of the cap).
    pub fn oldest_pending_at(&self) -> Option<Timestamp> {
        self.pending.iter().map(|m| m.received_at).min()
    }

    /// The platform message id a reply should quote: the last message of the batch.
    pub fn last_message_id(&self) -> Option<&str> {
        self.pending.last().map(|m| m.message_id.as_str())
    }
}

/// A conversation's timer as a round sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerState {
    pub due_at: Timestamp,
    pub attempts: u32,
}

/// A generated reply, ready for the final check.
#[derive(Debug, Clone)]
pub struct NewReply {
    pub text: String,
    pub usage: Option<TokenUsage>,
    pub llm_ms: u64,
    /// Messages of the batch left out of the reply (a group member over their token
    /// budget): each entry is stored as a notice covering them, in the commit's
    /// transaction, so they are answered exactly once, by the notice, or, if the reply
    /// is stale, not at all and still pending.
    pub held_out: Vec<HeldOut>,
    /// What the round's tools staged in memory: applied in the commit's transaction,
    /// so a reply dropped as stale writes none of it ([`MemoryWrites`]).
    pub memories: MemoryWrites,
}

/// Messages a reply leaves out, and the notice that answers them instead
/// ([`NewReply::held_out`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOut {
    /// The message rows ([`PendingMessage::row`]) the notice covers; each must have
    /// been collected with the batch (pending up to its `v0`).
    pub rows: Vec<i64>,
    pub text: String,
    /// The platform message id the notice quotes.
    pub reply_to: Option<String>,
}

/// The result of the final check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Stored in the outbox (the row, ready to deliver); the batch is answered.
    /// `forced` when newer messages had arrived but the cap made the reply go out
    /// anyway. `notices`: the rows of [`NewReply::held_out`] stored with it (a
    /// held-out set whose every message was edited since is not stored). `memories`:
    /// what [`NewReply::memories`] changed.
    Committed {
        outbox: OutboxRow,
        forced: bool,
        notices: Vec<OutboxRow>,
        memories: MemoryApplied,
    },
    /// A newer message arrived during generation: nothing stored, timer kept.
    Stale { version: Version },
}

/// What a round claims, read in the transaction that claimed it: the lease, the batch
/// to answer, and the outbox rows already owed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub lease: Lease,
    pub batch: Batch,
    /// Undelivered rows due now, oldest first (replies an earlier holder committed,
    /// deferred sends, notices): delivered before anything the round commits, since
    /// delivery keeps outbox order.
    pub owed: Vec<OutboxRow>,
    /// An undelivered row after `owed` waits for its retry: what the round commits
    /// waits behind it (delivery keeps outbox order), delivered by a later round.
    pub held_back: bool,
}

/// A round's claim of `conversation` for `holder` ([`RoundStore::claim_round`]): the
/// lease for `ttl` from `now`, and the batch read with `history` exchanges.
#[derive(Debug, Clone, Copy)]
pub struct RoundClaim<'a> {
    pub conversation: ConversationId,
    pub holder: &'a HolderId,
    pub ttl: std::time::Duration,
    pub history: usize,
    /// Read the summary and only the exchanges after it (`LULL_SUMMARY=on`); off: the
    /// newest exchanges, as if there were no summary.
    pub summaries: bool,
    pub now: Timestamp,
}

/// `reply` to `batch`, committed under `lease` if the final check passes
/// ([`RoundStore::commit_reply`]).
#[derive(Debug, Clone)]
pub struct ReplyCommit<'a> {
    pub lease: &'a Lease,
    pub batch: &'a Batch,
    pub reply: NewReply,
    pub now: Timestamp,
}

/// A round giving up on `batch` under `lease`, with `notice` as its answer and the
/// `quick_replies` it offers ([`RoundStore::give_up`]).
#[derive(Debug, Clone, Copy)]
pub struct GiveUp<'a> {
    pub lease: &'a Lease,
    pub batch: &'a Batch,
    pub notice: &'a str,
    pub quick_replies: &'a [lull_port::QuickReply],
    pub now: Timestamp,
}

/// The transcript of the pending message row `message`, written under `lease`
/// ([`RoundStore::store_transcript`]).
#[derive(Debug, Clone, Copy)]
pub struct TranscriptWrite<'a> {
    pub lease: &'a Lease,
    pub message: i64,
    pub transcript: &'a str,
    pub now: Timestamp,
}

/// The disarming of an idle conversation's timer under `lease`, if nothing is pending
/// at `v0` ([`RoundStore::disarm_idle_timer`]).
#[derive(Debug, Clone, Copy)]
pub struct IdleDisarm<'a> {
    pub lease: &'a Lease,
    pub v0: Version,
    pub now: Timestamp,
}

/// A failed generation under `lease`, to retry at `retry_at`
/// ([`RoundStore::record_failure`]).
#[derive(Debug, Clone, Copy)]
pub struct RoundFailure<'a> {
    pub lease: &'a Lease,
    pub retry_at: Timestamp,
    pub now: Timestamp,
}

/// Rounds: a conversation's round under its lease, from the claim and the batch to the
/// final check (or the give-up), with what it records on the way.
#[async_trait]
pub trait RoundStore: Send + Sync + 'static {
    /// Claim a conversation's lease for a round (the compare-and-swap of
    /// [`LeaseStore::claim_lease`](crate::store::LeaseStore::claim_lease)) and read, in the same transaction, what the round works
    /// on: the batch (as [`RoundStore::collect`]) and the outbox rows owed (as
    /// [`OutboxStore::due_outbox`](crate::store::OutboxStore::due_outbox)). `None`: another process holds the lease.
    /// Reservations of earlier leases on the conversation that were never settled
    /// (their round abandoned: lease lost, stop, crash) are given back in the same
    /// transaction, each on the day it was made.
    /// The timer's due time and the rows' creation times are on the caller's timeline
    /// (a backend that keeps time on its own clock translates them), so the round
    /// compares them with its own clock.
    async fn claim_round(&self, claim: RoundClaim<'_>) -> Result<Option<Claimed>, StoreError>;

    /// Read the conversation's version, pending messages, recent history and timer in
    /// one snapshot.
    async fn collect(
        &self,
        conversation: ConversationId,
        history: usize,
    ) -> Result<Batch, StoreError>;

    /// The final check and commit, in one transaction: lease still ours and version
    /// still `batch.v0` (or the cap reached) → store the reply, mark the batch
    /// answered, delete the timer unless a newer message re-armed it. A reply the cap
    /// forces out covers only the collected messages not edited since (an edit makes
    /// a message pending again, to be answered with its new text); if every one was
    /// edited, the reply is stale.
    async fn commit_reply(&self, commit: ReplyCommit<'_>) -> Result<CommitOutcome, StoreError>;

    /// Give up on a batch the model cannot answer (too long even when cut, or a
    /// request the server refuses), in one transaction under the lease (holder, token
    /// and expiry checked with the writes, as in [`RoundStore::commit_reply`]): store
    /// `notice` as an outbox row that covers every message still pending up to
    /// `batch.v0` (recorded in `reply_covers`, so receivers and the invariant checker
    /// see which messages it answered), set `answered_version = v0`, and delete the
    /// timer unless a newer message armed it (then it is re-armed for the messages
    /// still pending). No duplicate: a message already covered is not covered again.
    /// The notice never enters the model's history. `None`: nothing was pending up to
    /// `v0`, and nothing was stored.
    async fn give_up(&self, give_up: GiveUp<'_>) -> Result<Option<OutboxRow>, StoreError>;

    /// Store the transcript of a pending message's voice note or audio, in one
    /// transaction under the lease (holder, token and expiry checked with the write:
    /// a replaced holder's transcript is refused with `LeaseLost`). Stored once: a
    /// message that has a transcript keeps it, so nothing is transcribed twice, even
    /// after a crash. `false`: it already had one.
    async fn store_transcript(&self, write: TranscriptWrite<'_>) -> Result<bool, StoreError>;

    /// Delete the timer of a conversation with nothing pending at `v0` (under lease).
    async fn disarm_idle_timer(&self, disarm: IdleDisarm<'_>) -> Result<(), StoreError>;

    /// A generation failed: push the timer to `retry_at` and count the attempt (under
    /// lease). Returns the number of consecutive failed attempts.
    async fn record_failure(&self, failure: RoundFailure<'_>) -> Result<u32, StoreError>;
}
