//! Notices: the short messages lull sends on its own (a command's answer, a denial,
//! the model being down, a spent budget, an image too large). One builder for ingest
//! and rounds: a notice goes to a conversation, answers a message or none, and is
//! stored in the outbox at most once per dedupe key, so a redelivered update or a
//! repeated failure never notifies twice. The sentences are in [`crate::texts`]; the
//! answers a notice offers as buttons are decided with them ([`NoticeText`]) and stored
//! in the same row.

use lull_port::Incoming;

use super::Dispatcher;
use crate::domain::{ConversationRef, Timestamp};
use crate::store::{Batch, Enqueue, NewNotice, OutboxRow, StoreError};
use crate::texts::NoticeText;

/// Where a notice goes, and which message it answers.
pub(super) struct Notice<'a> {
    conversation: &'a ConversationRef,
    is_group: bool,
    reply_to: Option<String>,
}

impl<'a> Notice<'a> {
    /// A notice answering `incoming`: in a group, as a reply to it.
    pub(super) fn answering(incoming: &'a Incoming) -> Self {
        Self {
            conversation: &incoming.conversation,
            is_group: incoming.is_group,
            reply_to: incoming.is_group.then(|| incoming.message_id.clone()),
        }
    }

    /// A notice to `batch`'s conversation: in a group, as a reply to its last message.
    pub(super) fn answering_batch(batch: &'a Batch) -> Self {
        Self {
            conversation: &batch.conversation,
            is_group: batch.is_group,
            reply_to: batch
                .is_group
                .then(|| batch.last_message_id().map(str::to_owned))
                .flatten(),
        }
    }

    /// A notice to `batch`'s conversation, answering no message.
    pub(super) fn to_batch(batch: &'a Batch) -> Self {
        Self {
            conversation: &batch.conversation,
            is_group: batch.is_group,
            reply_to: None,
        }
    }

    /// Store the notice with the answers it offers, at most once per `dedupe_key`: the
    /// row if it was queued now.
    pub(super) async fn queue(
        self,
        d: &Dispatcher,
        text: impl Into<NoticeText>,
        dedupe_key: String,
        now: Timestamp,
    ) -> Result<Option<OutboxRow>, StoreError> {
        let NoticeText {
            text,
            quick_replies,
        } = text.into();
        let notice = NewNotice {
            conversation: self.conversation.clone(),
            is_group: self.is_group,
            text,
            reply_to: self.reply_to,
            quick_replies,
            dedupe_key,
        };
        d.store
            .enqueue_notice(Enqueue {
                notice,
                holder: &d.holder,
                now,
            })
            .await
    }
}

/// At ingest: answer `incoming` with a notice (at most once per dedupe key) and wake
/// the scheduler to deliver it (a round delivers the outbox; ingest never sends).
pub(super) async fn answer(
    d: &Dispatcher,
    incoming: &Incoming,
    text: impl Into<NoticeText>,
    dedupe_key: String,
    now: Timestamp,
) -> Result<(), StoreError> {
    if Notice::answering(incoming)
        .queue(d, text, dedupe_key, now)
        .await?
        .is_some()
    {
        d.wake_by(now);
    }
    Ok(())
}

/// At ingest: answer `incoming` once per message (a redelivered command is not
/// answered twice); `what` names the kind of answer in the dedupe key.
pub(super) async fn answer_message(
    d: &Dispatcher,
    incoming: &Incoming,
    text: impl Into<NoticeText>,
    what: &str,
    now: Timestamp,
) -> Result<(), StoreError> {
    let mut dedupe_key = format!("{what}/{}/{}", incoming.conversation, incoming.message_id);
    // The counter-test's switch: every process answers the command it received.
    if crate::switches::no_command_dedupe() {
        dedupe_key = format!("{dedupe_key}/{}", d.holder.as_str());
    }
    answer(d, incoming, text, dedupe_key, now).await
}
