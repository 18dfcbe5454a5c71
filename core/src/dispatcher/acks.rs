//! Ack reactions (`LULL_ACK_REACTION`): a visible "heard you" while lull waits for
//! the lull. When a message is stored and its reply is not due at once, lull reacts
//! to it; when the reply covering it has been delivered (or given up), the reaction
//! is taken off again, so a message wearing it is one lull still owes an answer.
//!
//! - **Once per burst.** The store decides which message carries the burst's
//!   reaction ([`ReactionStore::claim_ack`](crate::store::ReactionStore::claim_ack),
//!   unique per conversation and `answered_version`), so two processes storing
//!   messages of one burst set one reaction between them. It is normally the
//!   burst's first message: the one the user has waited on longest; reacting to every
//!   message of a burst would be noise, and one reply covers them all anyway.
//! - **Cleared once,** by the process that delivered the reply: it takes the row
//!   ([`ReactionStore::take_acks`](crate::store::ReactionStore::take_acks)) and takes
//!   the reaction off. A reaction set while that reply went out (the set was slower
//!   than the whole round) is found without its row right after it was set, and taken
//!   off again at once.
//! - **Never in the way.** Every call runs in a task of its own, beside ingest and
//!   delivery, bounded by [`CALL_LIMIT`], and is never retried: a failing or hanging
//!   reaction endpoint delays no reply. A failure is logged once per chat (WARN), the
//!   later ones at DEBUG.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lull_port::{ConversationRef, Outbound, SendError};

use crate::dispatcher::background::Background;
use crate::domain::ConversationId;
use crate::store::{AckOf, AcksCovered, Store};

/// One reaction call's time limit: a hanging endpoint holds nothing but its task.
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(5);

/// Chats whose failure is remembered (logged once) before the set starts afresh.
const KEEP_FAILED: usize = 1024;

/// The ack reactions of this process.
pub(super) struct Acks {
    /// `LULL_ACK_REACTION`; `None` when `off`.
    emoji: Option<String>,
    store: Arc<dyn Store>,
    /// Chats whose reaction failure was logged. A std mutex: held for one set
    /// operation, never across an await.
    failed: Mutex<HashSet<ConversationRef>>,
    /// Where a reaction's work runs: tracked, finished (or dropped at the bound) at
    /// shutdown.
    background: Background,
}

impl Acks {
    pub(super) fn new(
        emoji: Option<String>,
        store: Arc<dyn Store>,
        background: Background,
    ) -> Arc<Self> {
        Arc::new(Self {
            emoji,
            store,
            failed: Mutex::new(HashSet::new()),
            background,
        })
    }

    /// Message `message_id` of `conversation` (`id` in the store) was stored and its
    /// reply is not due at once: react to it if it is the one that carries its
    /// burst's reaction. Returns at once; the work runs beside.
    pub(super) fn stored(
        self: &Arc<Self>,
        outbound: Arc<dyn Outbound>,
        conversation: ConversationRef,
        id: ConversationId,
        message_id: String,
    ) {
        let Some(emoji) = self.emoji.clone().filter(|_| outbound.reactions()) else {
            return;
        };
        let acks = self.clone();
        self.background.finish(async move {
            let call = Call {
                outbound: outbound.as_ref(),
                conversation: &conversation,
                message_id: &message_id,
                emoji: &emoji,
            };
            // The counter-test's switch: a reaction on every message.
            if crate::switches::no_ack_claim() {
                acks.call(&call, true).await;
                return;
            }
            match acks
                .store
                .claim_ack(AckOf {
                    conversation: id,
                    message_id: &message_id,
                })
                .await
            {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::debug!(%conversation, error = %e, "could not claim the ack reaction; none is set");
                    return;
                }
            }
            if !acks.call(&call, true).await {
                return;
            }
            // The reply went out while the reaction was on its way: its deliverer took
            // the row (and cleared a reaction not yet there). Take it off now.
            if let Ok(false) = acks
                .store
                .ack_open(AckOf {
                    conversation: id,
                    message_id: &message_id,
                })
                .await
            {
                acks.call(&call, false).await;
            }
        });
    }

    /// A reply (or notice) covering `covers` was delivered, or given up: take off the
    /// reactions those messages carry. Returns at once; the work runs beside.
    pub(super) fn answered(
        self: &Arc<Self>,
        outbound: Arc<dyn Outbound>,
        conversation: ConversationRef,
        id: ConversationId,
        covers: Vec<String>,
    ) {
        let Some(emoji) = self.emoji.clone().filter(|_| outbound.reactions()) else {
            return;
        };
        if covers.is_empty() {
            return;
        }
        let acks = self.clone();
        self.background.finish(async move {
            let taken = match acks
                .store
                .take_acks(AcksCovered {
                    conversation: id,
                    covers: &covers,
                })
                .await
            {
                Ok(taken) => taken,
                Err(e) => {
                    tracing::debug!(%conversation, error = %e, "could not take the ack reactions of a reply; they stay");
                    return;
                }
            };
            for message_id in taken {
                let call = Call {
                    outbound: outbound.as_ref(),
                    conversation: &conversation,
                    message_id: &message_id,
                    emoji: &emoji,
                };
                acks.call(&call, false).await;
            }
        });
    }

    /// One attempt at setting (`on`) or taking off a reaction, within [`CALL_LIMIT`];
    /// whether it went through. A failure is logged once per chat.
    async fn call(&self, call: &Call<'_>, on: bool) -> bool {
        let attempt = call
            .outbound
            .react(call.conversation, call.message_id, call.emoji, on);
        let result = tokio::time::timeout(CALL_LIMIT, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(SendError::Transient(format!(
                    "no answer within {} s",
                    CALL_LIMIT.as_secs()
                )))
            });
        let Err(error) = result else {
            return true;
        };
        let what = if on { "set" } else { "take off" };
        let first = {
            let mut failed = self.failed.lock().expect("not poisoned");
            if failed.len() >= KEEP_FAILED {
                failed.clear();
            }
            failed.insert(call.conversation.clone())
        };
        let error = lull_port::secrets::redact(error.to_string());
        if first {
            tracing::warn!(conversation = %call.conversation, error, "could not {what} the ack reaction (LULL_ACK_REACTION); not retried, and later failures in this chat are logged at DEBUG");
        } else {
            tracing::debug!(conversation = %call.conversation, error, "could not {what} the ack reaction");
        }
        false
    }
}

/// The reaction a call is about.
struct Call<'a> {
    outbound: &'a dyn Outbound,
    conversation: &'a ConversationRef,
    message_id: &'a str,
    emoji: &'a str,
}
