//! What follows a stored message, the after-store effects of ingest: `title`, `rate`
//! (the rate limit's hold), `wake`, `ack` and `draft` (the order is the parent's list).
//! The message is stored by then: a failure here is logged, never reported as "not
//! stored" (a redelivery would only be a duplicate).

use lull_port::{Accepted, Incoming, IncomingKind};

use super::{AfterStore, Arriving, Step, Stored};
use crate::dispatcher::{Dispatcher, Event, notices};
use crate::domain::{ConversationId, Timestamp};
use crate::limits;
use crate::metrics as names;
use crate::store::{RateCheck, RateHold, RateWindow, StoreError};
use crate::texts;

impl AfterStore {
    /// The effect's name, as the parent's module doc lists it.
    pub(super) fn name(self) -> &'static str {
        match self {
            AfterStore::Title => "title",
            AfterStore::Rate => "rate",
            AfterStore::Wake => "wake",
            AfterStore::Ack => "ack",
            AfterStore::Draft => "draft",
        }
    }
}

impl Arriving<'_> {
    /// Count and announce a stored message.
    pub(super) fn announce(&self, stored: &Stored) {
        let Stored {
            conversation,
            version,
            due_at,
        } = *stored;
        metrics::counter!(names::MESSAGES_INGESTED).increment(1);
        tracing::debug!(%conversation, %version, due_in_ms = self.now.until(due_at).as_millis() as u64, "message stored");
        self.dispatcher.emit(Event::Ingested {
            conversation,
            version,
        });
    }

    /// Run one after-store effect.
    pub(super) async fn after_store(&self, effect: AfterStore, stored: &Stored) -> Step {
        match effect {
            AfterStore::Title => {
                if let Some(title) = &self.incoming.title {
                    crate::dispatcher::titles::note(self.dispatcher, stored.conversation, title)
                        .await;
                }
                Step::Next
            }
            AfterStore::Rate => self.rate(stored).await,
            AfterStore::Wake => {
                self.dispatcher.wake_by(stored.due_at);
                Step::Next
            }
            AfterStore::Ack => self.ack(stored),
            AfterStore::Draft => self.draft(stored),
        }
    }

    /// Over `LULL_RATE_PER_MIN` the message stays stored and pending, held: answered
    /// with the rest when the hold ends (nothing else follows now). Admins are not
    /// limited. An edit counts as a message: it makes the batch stale as a new message
    /// does, so unlimited edits could keep every generation from being answered.
    async fn rate(&self, stored: &Stored) -> Step {
        let d = self.dispatcher;
        let limits = &d.settings.limits;
        if limits.rate_per_min == 0 || self.admin {
            return Step::Next;
        }
        let conversation = stored.conversation;
        let check = RateCheck {
            conversation,
            user_id: &self.incoming.user_id,
            rate: RateWindow {
                max: limits.rate_per_min,
                window: limits::rate_window(),
            },
            now: self.now,
        };
        match d.store.hold_over_rate(check).await {
            Ok(None) => Step::Next,
            Ok(Some(hold)) => {
                if let Err(e) = rate_held(d, &self.incoming, conversation, hold, self.now).await {
                    tracing::warn!(%conversation, error = %e, "could not tell a user about their rate limit");
                }
                Step::Done(Accepted::Stored {
                    conversation,
                    version: stored.version,
                })
            }
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "could not apply the rate limit; the message is answered as usual");
                Step::Next
            }
        }
    }

    /// 👀 on a burst whose reply is not immediate (see `acks`).
    fn ack(&self, stored: &Stored) -> Step {
        let d = self.dispatcher;
        let incoming = &self.incoming;
        if incoming.kind == IncomingKind::New
            && stored.due_at > self.now
            && let Some(outbound) = d.outbounds.get(&incoming.conversation.platform)
        {
            d.acks.stored(
                outbound.clone(),
                incoming.conversation.clone(),
                stored.conversation,
                incoming.message_id.clone(),
            );
        }
        Step::Next
    }

    /// "Thinking…" in the conversation's draft while the debounce waits.
    fn draft(&self, stored: &Stored) -> Step {
        let d = self.dispatcher;
        let conversation = &self.incoming.conversation;
        if let Some(outbound) = d.drafts.outbound(&d.outbounds, conversation) {
            d.drafts
                .placeholder(outbound, conversation.clone(), stored.version);
        }
        Step::Next
    }
}

/// A message was held by the rate limit: count it, and tell the user once per hold
/// when their messages will be answered.
async fn rate_held(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    conversation: ConversationId,
    hold: RateHold,
    now: Timestamp,
) -> Result<(), StoreError> {
    metrics::counter!(names::LIMITED, "reason" => "rate").increment(1);
    tracing::info!(%conversation, user = %incoming.user_id, until = hold.until.0, "over LULL_RATE_PER_MIN: messages held");
    dispatcher.emit(Event::Limited {
        conversation,
        reason: "rate",
        until: hold.until,
    });
    if !hold.began {
        return Ok(());
    }
    let limits = &dispatcher.settings.limits;
    let text = texts::rate_text(limits.rate_per_min, &limits.timezone.show(hold.until, now));
    let dedupe_key = format!(
        "rate/{}/{}/{}",
        incoming.conversation, incoming.user_id, hold.until.0
    );
    notices::answer(dispatcher, incoming, text, dedupe_key, now).await
}
