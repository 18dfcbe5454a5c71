//! What the dispatcher did, broadcast for observers: `lull chat` waits on these, and
//! tests observe progress through them instead of sleeping.

use crate::domain::{ConversationId, LeaseToken, OutboxId, Timestamp, Version};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message (or edit) was stored and the timer armed.
    Ingested {
        conversation: ConversationId,
        version: Version,
    },
    /// This process won the lease for a round.
    Claimed {
        conversation: ConversationId,
        token: LeaseToken,
    },
    /// Another process held the lease.
    Contended { conversation: ConversationId },
    /// A reply passed the final check and sits in the outbox.
    Committed {
        conversation: ConversationId,
        outbox: OutboxId,
        v0: Version,
        batch: usize,
        forced: bool,
    },
    /// A reply was dropped because the conversation moved on during generation.
    DroppedStale {
        conversation: ConversationId,
        v0: Version,
        version: Version,
    },
    /// An outbox row (reply or notice) was delivered completely.
    Delivered {
        conversation: ConversationId,
        outbox: OutboxId,
    },
    /// An outbox row was given up (refused, or still failing at its deadline): it is
    /// marked failed and never tried again.
    DeadLettered {
        conversation: ConversationId,
        outbox: OutboxId,
    },
    /// The lease was lost mid-round; the work was abandoned.
    LeaseLost { conversation: ConversationId },
    /// The model failed; the messages stay pending and are retried later.
    GenerationFailed {
        conversation: ConversationId,
        attempts: u32,
        error: String,
    },
    /// A job's occurrence fired here: its notice or its message is stored.
    JobFired {
        conversation: ConversationId,
        job: i64,
        scheduled_at: Timestamp,
    },
    /// The model cannot answer a batch (too long, or the request refused): a notice
    /// covering its messages sits in the outbox, and the batch is ended.
    GaveUp {
        conversation: ConversationId,
        outbox: OutboxId,
        batch: usize,
        error: String,
    },
    /// A limit holds the conversation's messages (stored, pending) until `until`:
    /// `reason` is `rate`, `user_budget` or `bot_budget`.
    Limited {
        conversation: ConversationId,
        reason: &'static str,
        until: Timestamp,
    },
    /// A newer message overtook a generation: it was stopped before its reply was
    /// written (the covering round starts now).
    GenerationCancelled {
        conversation: ConversationId,
        v0: Version,
    },
    /// A call that acts was reserved and starts running (`action`: its journal row).
    ActionStarted {
        conversation: ConversationId,
        action: i64,
    },
    /// A destructive call's question was queued (`action`: its journal row).
    ApprovalAsked {
        conversation: ConversationId,
        action: i64,
    },
    /// The conversation moved to `version` without a new message (a setting changed,
    /// `/stop`): a generation collected before it is stale, and is stopped.
    Moved {
        conversation: ConversationId,
        version: Version,
    },
    /// A round ended (whatever happened in it).
    RoundEnded { conversation: ConversationId },
}

impl Event {
    pub fn conversation(&self) -> ConversationId {
        match self {
            Event::Ingested { conversation, .. }
            | Event::Claimed { conversation, .. }
            | Event::Contended { conversation }
            | Event::Committed { conversation, .. }
            | Event::DroppedStale { conversation, .. }
            | Event::Delivered { conversation, .. }
            | Event::DeadLettered { conversation, .. }
            | Event::LeaseLost { conversation }
            | Event::GenerationFailed { conversation, .. }
            | Event::GaveUp { conversation, .. }
            | Event::JobFired { conversation, .. }
            | Event::Limited { conversation, .. }
            | Event::GenerationCancelled { conversation, .. }
            | Event::ActionStarted { conversation, .. }
            | Event::ApprovalAsked { conversation, .. }
            | Event::Moved { conversation, .. }
            | Event::RoundEnded { conversation } => *conversation,
        }
    }
}
