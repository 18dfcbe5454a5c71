//! One round for one conversation: claim, deliver what is owed, collect, generate
//! once, final check, deliver. Every step after the claim runs under the lease; a
//! lost lease abandons the round wherever it is.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, Event, LeaseKeeper};
use crate::domain::{ConversationId, LeaseKey};
use crate::llm::{FailureKind, Generation, LlmError, Prompt};
use crate::metrics as names;
use crate::store::{Batch, CommitOutcome, NewNotice, NewReply, StoreError};
use crate::timing::FAILURE_BACKOFF;

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    /// Nothing was due after all (another round got there first, or only a future
    /// timer remains).
    Idle,
    /// Another process holds the lease.
    Contended,
    /// A reply was committed and delivered.
    Answered,
    /// A newer message made the reply stale; it was dropped and the timer kept.
    Stale,
    /// The model failed; the messages stay pending with a backoff.
    LlmFailed,
    /// The model cannot answer the batch (too long, or refused): the user was told
    /// and the batch ended.
    GaveUp,
    /// Delivery was deferred (platform rate limit or outage).
    Deferred,
    /// The lease was lost mid-round; nothing more was written.
    LeaseLost,
    /// Shutdown stopped the round; the lease was handed back.
    Stopped,
    /// An unexpected error (database trouble): the scheduler cools the conversation
    /// down before trying again.
    Failed,
}

/// Why a step ended the round early.
pub(crate) enum Interrupt {
    LeaseLost,
    Stopped,
    Deferred,
    Store(StoreError),
}

impl From<StoreError> for Interrupt {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::LeaseLost(_) => Interrupt::LeaseLost,
            other => Interrupt::Store(other),
        }
    }
}

impl Interrupt {
    fn into_end(
        self,
        dispatcher: &Dispatcher,
        conversation: ConversationId,
        keeper: &LeaseKeeper,
    ) -> RoundEnd {
        match self {
            Interrupt::LeaseLost => {
                keeper.mark_lost();
                tracing::warn!(%conversation, "lease lost mid-round; abandoning");
                dispatcher.emit(Event::LeaseLost { conversation });
                RoundEnd::LeaseLost
            }
            Interrupt::Stopped => RoundEnd::Stopped,
            Interrupt::Deferred => RoundEnd::Deferred,
            Interrupt::Store(e) => {
                tracing::error!(%conversation, error = %e, "round failed");
                RoundEnd::Failed
            }
        }
    }
}

/// What the failure notice says: once per pending batch, not once per attempt.
const MODEL_DOWN_TEXT: &str = "Sorry, I can't reach the language model right now. \
I've kept your messages and will answer as soon as it's back.";

/// What a batch too long for the model gets, once; then the conversation moves on.
const TOO_LONG_TEXT: &str = "Sorry, your messages were too long for the language model, \
even after I shortened them, so I couldn't answer them. Please send a shorter version, \
or split it into smaller parts.";

/// What a batch gets when the model server refuses the request (a wrong key, model
/// or URL): honest, without the server's words (they stay in the operator's log).
const REFUSED_TEXT: &str = "Sorry, I couldn't answer: the language model service refused \
the request. The bot's operator can find the reason in the logs; please try again later.";

impl Dispatcher {
    /// Run one round for `conversation`. `stop` is the hard stop of shutdown: the round
    /// abandons its work and hands the lease back.
    pub(crate) async fn round(
        self: &Arc<Self>,
        conversation: ConversationId,
        stop: &CancellationToken,
    ) -> RoundEnd {
        let keeper = match self.claim(LeaseKey::Conversation(conversation)).await {
            Ok(Some(keeper)) => keeper,
            Ok(None) => {
                metrics::counter!(names::LEASE_CONTENDED).increment(1);
                tracing::debug!(%conversation, "lease contended: another process is answering");
                self.emit(Event::Contended { conversation });
                return RoundEnd::Contended;
            }
            Err(e) => {
                tracing::warn!(%conversation, error = %e, "could not claim a lease");
                return RoundEnd::Failed;
            }
        };
        self.emit(Event::Claimed {
            conversation,
            token: keeper.lease().token,
        });
        let end = match self.under_lease(conversation, &keeper, stop).await {
            Ok(end) => end,
            Err(interrupt) => interrupt.into_end(self, conversation, &keeper),
        };
        keeper.release().await;
        self.emit(Event::RoundEnded { conversation });
        end
    }

    async fn under_lease(
        &self,
        conversation: ConversationId,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
    ) -> Result<RoundEnd, Interrupt> {
        // Replies committed earlier but not delivered (a crashed holder, a deferred
        // send) and notices go first, in outbox order.
        self.deliver_due(conversation, keeper, stop).await?;

        let batch = self
            .store
            .collect(conversation, self.settings.history)
            .await?;
        let now = self.clock.now();
        if batch.pending.is_empty() {
            if batch.timer.is_some() {
                self.store
                    .disarm_idle_timer(&keeper.lease(), batch.v0, now)
                    .await?;
            }
            return Ok(RoundEnd::Idle);
        }
        if batch.timer.is_some_and(|t| t.due_at > now) {
            return Ok(RoundEnd::Idle);
        }

        let started = Instant::now();
        let generated = tokio::select! {
            generated = self.generate(&batch) => generated,
            () = keeper.lost() => return Err(Interrupt::LeaseLost),
            () = stop.cancelled() => return Err(Interrupt::Stopped),
        };
        let llm_time = started.elapsed();
        let generation = match generated {
            Ok(generation) => generation,
            Err(error) if error.kind() == FailureKind::Transient => {
                return self.generation_failed(&batch, keeper, stop, error).await;
            }
            Err(error) => return self.give_up(&batch, keeper, stop, error).await,
        };

        let reply = NewReply {
            text: self.bounded(conversation, generation.text),
            usage: generation.usage,
            llm_ms: llm_time.as_millis() as u64,
        };
        let lease = keeper.lease();
        // The final check: lease still ours and nothing new since v0 (or the cap).
        match self
            .store
            .commit_reply(
                &lease,
                &batch,
                reply,
                self.settings.timers,
                self.clock.now(),
            )
            .await?
        {
            CommitOutcome::Committed { outbox, forced } => {
                metrics::histogram!(names::BATCH_MESSAGES).record(batch.pending.len() as f64);
                tracing::info!(
                    %conversation,
                    version = batch.v0.0,
                    batch = batch.pending.len(),
                    token = lease.token.0,
                    llm_ms = llm_time.as_millis() as u64,
                    prompt_tokens = generation.usage.map(|u| u.prompt),
                    completion_tokens = generation.usage.map(|u| u.completion),
                    forced,
                    "reply committed"
                );
                self.emit(Event::Committed {
                    conversation,
                    outbox,
                    v0: batch.v0,
                    batch: batch.pending.len(),
                    forced,
                });
                self.deliver_due(conversation, keeper, stop).await?;
                Ok(RoundEnd::Answered)
            }
            CommitOutcome::Stale { version } => {
                metrics::counter!(names::REPLIES_DROPPED_STALE).increment(1);
                tracing::debug!(%conversation, v0 = batch.v0.0, version = version.0, "stale reply dropped: a newer message arrived");
                self.emit(Event::DroppedStale {
                    conversation,
                    v0: batch.v0,
                    version,
                });
                Ok(RoundEnd::Stale)
            }
        }
    }

    /// Ask the model once, showing "typing…" on the platform meanwhile.
    async fn generate(&self, batch: &Batch) -> Result<Generation, LlmError> {
        let prompt = Prompt {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            history: batch.history.clone(),
            batch: batch.pending.clone(),
            note: None,
        };
        let outbound = self.outbounds.get(&batch.conversation.platform).cloned();
        let typing = async {
            match outbound
                .as_ref()
                .and_then(|o| o.typing_every().map(|every| (o, every)))
            {
                Some((outbound, every)) => loop {
                    if let Err(e) = outbound.typing(&batch.conversation).await {
                        tracing::debug!(conversation = %batch.conversation, error = %e, "typing indicator failed");
                    }
                    tokio::time::sleep(every).await;
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            generated = self.responder.respond(&prompt) => generated,
            never = typing => never,
        }
    }

    /// A reply as it may be committed, whichever responder wrote it: without any
    /// registered secret, and at most `max_reply_chars` long (cut at a paragraph, line
    /// or word, with a note saying so).
    fn bounded(&self, conversation: ConversationId, text: String) -> String {
        let text = lull_port::secrets::redact(text);
        let max = self.settings.max_reply_chars;
        let note = format!("[… reply cut at {max} characters]");
        match lull_port::split::truncate(&text, max, &note) {
            Some(cut) => {
                tracing::warn!(
                    %conversation,
                    chars = lull_port::split::char_len(&text),
                    max,
                    "reply longer than LULL_MAX_REPLY_CHARS; cut"
                );
                cut
            }
            None => text,
        }
    }

    /// The model cannot answer this batch: it is too long even when cut, or the server
    /// refuses the request as configured. Tell the user once and end the batch (a
    /// give-up notice covers its messages), so the conversation moves on instead of
    /// retrying a request that fails the same way every time.
    async fn give_up(
        &self,
        batch: &Batch,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
        error: LlmError,
    ) -> Result<RoundEnd, Interrupt> {
        let conversation = batch.conversation_id;
        let text = if error.kind() == FailureKind::TooLong {
            tracing::warn!(%conversation, batch = batch.pending.len(), error = %error, "the messages are too long for the model even when cut; telling the user and moving on (if short prompts are refused too, check {})", error.setting());
            TOO_LONG_TEXT
        } else {
            tracing::error!(%conversation, batch = batch.pending.len(), error = %error, "the model server refused the request; telling the user and moving on. Check {}", error.setting());
            REFUSED_TEXT
        };
        let given_up = self
            .store
            .give_up(
                &keeper.lease(),
                batch,
                text,
                self.settings.timers,
                self.clock.now(),
            )
            .await?;
        if let Some(outbox) = given_up {
            self.emit(Event::GaveUp {
                conversation,
                outbox,
                batch: batch.pending.len(),
                error: error.to_string(),
            });
        }
        self.deliver_due(conversation, keeper, stop).await?;
        Ok(RoundEnd::GaveUp)
    }

    /// The model failed: keep the messages pending, back off, tell the user once.
    async fn generation_failed(
        &self,
        batch: &Batch,
        keeper: &LeaseKeeper,
        stop: &CancellationToken,
        error: LlmError,
    ) -> Result<RoundEnd, Interrupt> {
        let conversation = batch.conversation_id;
        let attempts = batch.timer.map_or(0, |t| t.attempts) + 1;
        let now = self.clock.now();
        // Growing backoff, and never sooner than the server asked.
        let wait = FAILURE_BACKOFF.delay_honouring(attempts, error.retry_after());
        let retry_at = now.plus(wait);
        let attempts = self
            .store
            .record_failure(&keeper.lease(), retry_at, now)
            .await?;
        tracing::warn!(%conversation, attempts, error = %error, retry_in_ms = now.until(retry_at).as_millis() as u64, "generation failed; messages stay pending");
        self.emit(Event::GenerationFailed {
            conversation,
            attempts,
            error: error.to_string(),
        });
        let first = batch.pending.first().map_or(0, |m| m.row);
        let notice = NewNotice {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            text: MODEL_DOWN_TEXT.to_owned(),
            reply_to: None,
            dedupe_key: format!("model-down/{}/{first}", batch.conversation),
        };
        self.store.enqueue_notice(notice, &self.holder, now).await?;
        self.deliver_due(conversation, keeper, stop).await?;
        Ok(RoundEnd::LlmFailed)
    }
}
