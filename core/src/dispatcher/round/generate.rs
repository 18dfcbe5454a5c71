//! Asking the model, the stages **context** (the prompt of a batch) and **generate**:
//! one generation shown as a live draft (or
//! "typing…") while it is written, the reply bounded before it is committed, and
//! what a failure leaves (the messages kept pending with a notice, or the batch
//! ended when retrying cannot help).

use std::time::Instant;

use super::tools::Generated;
use super::{Answering, Ending, Flow, Interrupt, Round, StaleAt, add_note};
use crate::dispatcher::Event;
use crate::dispatcher::bounds;
use crate::dispatcher::drafts::newer_message;
use crate::domain::Said;
use crate::llm::{FailureKind, Generation, LlmError, Partial, Prompt};
use crate::store::{Batch, GiveUp, OutboxRow, OverheardQuery, PendingMessage, RoundFailure};
use crate::texts;
use crate::timing::FAILURE_BACKOFF;

impl Round<'_> {
    /// The `context` stage: the prompt of the batch as `pay` and `transcribe` left it,
    /// with the chat's settings — read after the claim read `v0`, so a change since
    /// moved the version and the final check refuses a reply written with older ones —
    /// the group context, and what transcribing left to tell the model.
    pub(super) async fn context(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        let mut prompt = self.prompt(&a.batch);
        let chosen = d.store.conversation_settings(&a.batch.conversation).await?;
        prompt.choices = d.settings.controls.choices(&chosen);
        prompt.overheard = self.overheard(&a.batch).await;
        for note in &a.audio.model {
            add_note(&mut prompt, note);
        }
        a.prompt = prompt;
        Ok(Flow::Go)
    }

    /// The `generate` stage: the model asked once (its tool calls answered in between,
    /// the approvals' turns shown after the batch). A model without vision that
    /// refuses the images is asked again with the text alone, and the chat told once.
    pub(super) async fn generate_reply(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let started = Instant::now();
        a.prompt.turns.append(&mut a.approvals.turns);
        let mut generated = self
            .generate_acting(&a.batch, &mut a.prompt, &mut a.rows, a.toolbox.as_ref())
            .await?;
        if let Generated::Failed { error, spent } = &generated
            && error.kind() == FailureKind::Refused
            && !a.prompt.images.is_empty()
        {
            tracing::warn!(conversation = %self.conversation, error = %error, "the model refused the images; answering the text without them (set LULL_VISION=off for a model without vision)");
            let spent_before = *spent;
            self.dispatcher
                .images_refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
            a.prompt.images.clear();
            add_note(&mut a.prompt, texts::NO_VISION_NOTE);
            a.rows.extend(self.no_vision_notice(&a.batch).await?);
            // Asked again: what the first attempt staged is decided again.
            a.memory.reset();
            generated = self
                .generate_acting(&a.batch, &mut a.prompt, &mut a.rows, a.toolbox.as_ref())
                .await?;
            generated.add_spent(spent_before);
        }
        Ok(match generated {
            Generated::Reply { generation, spent } => {
                a.spent = spent;
                a.generation = Some((generation, started.elapsed()));
                Flow::Go
            }
            Generated::Failed { error, spent } => {
                a.spent = spent;
                Flow::End(Ending::Failed(error))
            }
            Generated::Stale { version, spent } => {
                a.spent = spent;
                let at = StaleAt::BeforeAction;
                Flow::End(Ending::Stale { version, at })
            }
        })
    }

    /// The prompt for `batch`, without images yet.
    pub(super) fn prompt(&self, batch: &Batch) -> Prompt {
        self.prompt_of(batch, &batch.pending)
    }

    /// The prompt for `messages` of `batch`, without images yet.
    pub(super) fn prompt_of(&self, batch: &Batch, messages: &[PendingMessage]) -> Prompt {
        Prompt {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            history: batch.history.clone(),
            overheard: Vec::new(),
            memories: None,
            summary: batch
                .summary
                .as_ref()
                .map(crate::dispatcher::summaries::block),
            batch: messages
                .iter()
                .map(|m| Said::new(&m.author, m.said()))
                .collect(),
            note: None,
            images: Vec::new(),
            max_tokens: None,
            tools: Vec::new().into(),
            turns: Vec::new(),
            choices: Default::default(),
        }
    }

    /// The group context of `batch` (`LULL_GROUP_CONTEXT`): its recent overheard
    /// messages. Context only: a failure to read it is logged and the batch answered
    /// without.
    pub(super) async fn overheard(&self, batch: &Batch) -> Vec<Said> {
        let keep = self.dispatcher.settings.group_context;
        if keep == 0 || !batch.is_group {
            return Vec::new();
        }
        match self
            .dispatcher
            .store
            .overheard(OverheardQuery {
                conversation: self.conversation,
                limit: keep,
            })
            .await
        {
            Ok(overheard) => overheard,
            Err(error) => {
                tracing::warn!(conversation = %self.conversation, %error, "could not read the group context; answering without it");
                Vec::new()
            }
        }
    }

    /// Ask the model once, showing the reply as a live draft while it is written
    /// where the platform has drafts, else "typing…".
    pub(super) async fn generate(
        &self,
        batch: &Batch,
        prompt: &Prompt,
    ) -> Result<Generation, LlmError> {
        let responder = &self.dispatcher.responder;
        self.showing(batch, |partial| async move {
            responder.respond(prompt, &partial).await
        })
        .await
    }

    /// Do `work` while the conversation shows it: `work` writes what to show into the
    /// [`Partial`] it is handed, which becomes a live draft where the platform has
    /// drafts (never committed: only the reply is), else "typing…" is shown.
    pub(super) async fn showing<T, F, Fut>(&self, batch: &Batch, work: F) -> T
    where
        F: FnOnce(Partial) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let d = self.dispatcher;
        let outbound = d.outbounds.get(&batch.conversation.platform).cloned();
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
        let (partial, drafting) = match d.drafts.outbound(&d.outbounds, &batch.conversation) {
            Some(outbound) => {
                let (partial, text) = Partial::watched();
                let drafter = d.drafts.for_round(
                    outbound,
                    batch.conversation.clone(),
                    batch.v0,
                    d.settings.max_reply_chars,
                );
                // Subscribed before the work starts: a message stored from now on
                // stops the draft.
                let newer = newer_message(d.subscribe(), self.conversation, batch.v0);
                (partial, Some(async move { drafter.run(text, newer).await }))
            }
            None => (Partial::ignored(), None),
        };
        let shown = async {
            if let Some(drafting) = drafting {
                // Returns only if the platform refuses drafts.
                drafting.await;
            }
            typing.await
        };
        tokio::select! {
            done = work(partial) => done,
            never = shown => never,
        }
    }

    /// A reply as it may be committed, whichever responder wrote it: without any
    /// registered secret, and at most `max_reply_chars` long (cut at a paragraph, line
    /// or word, with a note saying so).
    /// Room is left for `reserve` more characters (a report of the actions taken,
    /// which is never cut).
    pub(super) fn bounded_leaving(&self, text: String, reserve: usize) -> String {
        let conversation = self.conversation;
        let text = lull_port::secrets::redact(text);
        let max = self
            .dispatcher
            .settings
            .max_reply_chars
            .saturating_sub(reserve)
            .max(1);
        match bounds::cut(&text, max) {
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
    pub(super) async fn give_up(
        &self,
        batch: &Batch,
        error: LlmError,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let text = if error.kind() == FailureKind::TooLong {
            tracing::warn!(%conversation, batch = batch.pending.len(), error = %error, "the messages are too long for the model even when cut; telling the user and moving on (if short prompts are refused too, check {})", error.setting());
            texts::TOO_LONG_TEXT
        } else {
            tracing::error!(%conversation, batch = batch.pending.len(), error = %error, "the model server refused the request; telling the user and moving on. Check {}", error.setting());
            texts::REFUSED_TEXT
        };
        // Actions the batch took are facts: the notice that ends it says so, since no
        // reply will.
        let report = self.actions_report(batch, &[]).await?;
        let notice = texts::NoticeText::from(text).followed_by(report);
        let given_up = d
            .store
            .give_up(GiveUp {
                lease: &self.keeper.lease(),
                batch,
                notice: &notice.text,
                quick_replies: &notice.quick_replies,
                now: d.clock.now(),
            })
            .await?;
        if let Some(outbox) = &given_up {
            d.emit(Event::GaveUp {
                conversation,
                outbox: outbox.id,
                batch: batch.pending.len(),
                error: error.to_string(),
            });
        }
        Ok(given_up)
    }

    /// The model failed: keep the messages pending, back off, tell the user once (the
    /// notice, if queued now, is returned for delivery).
    pub(super) async fn generation_failed(
        &self,
        batch: &Batch,
        error: LlmError,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let attempts = batch.timer.map_or(0, |t| t.attempts) + 1;
        let now = d.clock.now();
        // Growing backoff, and never sooner than the server asked.
        let wait = FAILURE_BACKOFF.delay_honouring(attempts, error.retry_after());
        let retry_at = now.plus(wait);
        let attempts = d
            .store
            .record_failure(RoundFailure {
                lease: &self.keeper.lease(),
                retry_at,
                now,
            })
            .await?;
        tracing::warn!(%conversation, attempts, error = %error, retry_in_ms = now.until(retry_at).as_millis() as u64, "generation failed; messages stay pending");
        d.emit(Event::GenerationFailed {
            conversation,
            attempts,
            error: error.to_string(),
        });
        let first = batch.pending.first().map_or(0, |m| m.row);
        let dedupe_key = format!("model-down/{}/{first}", batch.conversation);
        self.notice(batch, texts::MODEL_DOWN_TEXT, dedupe_key).await
    }
}
