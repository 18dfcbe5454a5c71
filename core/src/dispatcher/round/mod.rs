//! One round for one conversation: claim the lease, collect, generate once, final
//! check, then deliver what the outbox holds. Every step after the claim runs under
//! the lease; a lost lease abandons the round wherever it is.
//!
//! This file holds the round's flow and the final check; its steps have rooms of
//! their own: `budget` (who pays, the reservation, the settle), `media` (voice
//! messages transcribed, images fetched) and `generate` (the prompt, the model
//! call shown as a draft or "typing…", what a failure leaves).

mod approvals;
mod budget;
mod generate;
mod media;
mod tools;

pub(super) use tools::batch_report;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::interrupt::Interrupt;
use super::lease_keeper::LeaseKeeper;
use super::notices::Notice;
use super::{Dispatcher, Event};
use crate::domain::ConversationId;
use crate::llm::{FailureKind, Prompt};
use crate::metrics as names;
use crate::store::{
    Batch, Claimed, CommitOutcome, IdleDisarm, NewReply, OutboxRow, ReplyCommit, RoundClaim,
    StoreError,
};
use crate::texts;
use tools::Generated;

/// Add `note` to what the model is told after the batch (each note once).
fn add_note(prompt: &mut Prompt, note: &str) {
    match &mut prompt.note {
        Some(notes) if notes.contains(note) => {}
        Some(notes) => {
            notes.push('\n');
            notes.push_str(note);
        }
        None => prompt.note = Some(note.to_owned()),
    }
}

/// Run one round for `conversation`. `stop` is the hard stop of shutdown: the round
/// abandons its work and hands the lease back. `Err` only for unexpected database
/// trouble, after which the scheduler cools the conversation down; another process
/// holding the lease, a lost lease, a deferred delivery or a stop are all `Ok`.
pub(super) async fn run(
    dispatcher: &Arc<Dispatcher>,
    conversation: ConversationId,
    stop: &CancellationToken,
) -> Result<(), StoreError> {
    let d = dispatcher;
    // One transaction: the claim, the batch and the rows owed.
    let claimed_at = d.clock.now();
    let claimed = d
        .store
        .claim_round(RoundClaim {
            conversation,
            holder: &d.holder,
            ttl: d.settings.lease.ttl(),
            history: d.settings.history,
            now: claimed_at,
        })
        .await;
    let Claimed {
        lease,
        batch,
        owed,
        held_back,
    } = match claimed {
        Ok(Some(claimed)) => claimed,
        Ok(None) => {
            metrics::counter!(names::LEASE_CONTENDED).increment(1);
            tracing::debug!(%conversation, "lease contended: another process is answering");
            d.emit(Event::Contended { conversation });
            return Ok(());
        }
        Err(e) => {
            tracing::warn!(%conversation, error = %e, "could not claim a lease");
            return Err(e);
        }
    };
    d.emit(Event::Claimed {
        conversation,
        token: lease.token,
    });
    let keeper = LeaseKeeper::keep(d, lease, claimed_at);
    let round = Round {
        dispatcher: d,
        conversation,
        keeper: &keeper,
        stop,
    };
    let delivery = Delivery::new(d, conversation, &keeper, stop);
    let result = match round.under_lease(batch, owed, held_back, &delivery).await {
        Ok(()) | Err(Interrupt::Stopped | Interrupt::Deferred) => Ok(()),
        Err(Interrupt::LeaseLost) => {
            keeper.mark_lost();
            tracing::warn!(%conversation, "lease lost mid-round; abandoning");
            d.emit(Event::LeaseLost { conversation });
            Ok(())
        }
        Err(Interrupt::Store(e)) => {
            tracing::error!(%conversation, error = %e, "round failed");
            Err(e)
        }
    };
    // The last part delivered is recorded with the release (one write, not two), and
    // the release is retried until it is recorded: a delivered part is a fact.
    let last_sent = delivery.take_last_sent();
    keeper.release_recording(last_sent, stop).await;
    d.emit(Event::RoundEnded { conversation });
    result
}

/// One round under a conversation's lease.
struct Round<'a> {
    dispatcher: &'a Dispatcher,
    conversation: ConversationId,
    keeper: &'a LeaseKeeper,
    stop: &'a CancellationToken,
}

impl Round<'_> {
    async fn under_lease(
        &self,
        batch: Batch,
        owed: Vec<OutboxRow>,
        held_back: bool,
        delivery: &Delivery<'_>,
    ) -> Result<(), Interrupt> {
        // Rows owed from earlier (a crashed holder, a deferred send, notices) come
        // first, in outbox order; then what this round adds, unless a row waiting for
        // its retry holds the outbox back (a later round delivers them, in order).
        let mut added = Vec::new();
        self.answer(batch, &mut added).await?;
        let mut rows = owed;
        if !held_back {
            rows.extend(added);
        }
        delivery.deliver(rows).await
    }

    /// Answer the pending messages, if any are due: generate once, and the final
    /// check. A failure of the model keeps them pending (or ends the batch when
    /// retrying cannot help), with a notice. What is committed joins `rows`.
    async fn answer(&self, batch: Batch, rows: &mut Vec<OutboxRow>) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let now = d.clock.now();
        if batch.pending.is_empty() {
            if batch.timer.is_some() {
                d.store
                    .disarm_idle_timer(IdleDisarm {
                        lease: &self.keeper.lease(),
                        v0: batch.v0,
                        now,
                    })
                    .await?;
            }
            return Ok(());
        }
        if batch.timer.is_some_and(|t| t.due_at > now) {
            return Ok(());
        }

        // Approvals the batch answers are decided (and the approved calls run) first:
        // they cost no tokens, so a person over their budget can still answer one.
        let Some(approvals) = self.take_approvals(&batch).await? else {
            return Ok(());
        };
        // Who pays: in a group, a member over budget is left out (see `budget`); a
        // notice that ends the batch says what its approvals did.
        let Some((mut batch, held_out)) =
            self.who_pays(batch, rows, &approvals.report, now).await?
        else {
            return Ok(());
        };

        // Voice first, then images: both before the budget is reserved, so the
        // estimate counts the transcripts (stored once, whatever the budget says).
        let transcribed = tokio::select! {
            transcribed = self.transcribe(&mut batch) => transcribed?,
            () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
            () = self.stop.cancelled() => return Err(Interrupt::Stopped),
        };
        let notes = match transcribed {
            Ok(notes) => notes,
            Err(error) => {
                rows.extend(self.generation_failed(&batch, error).await?);
                return Ok(());
            }
        };
        // Told plainly, once per message; the rest of the burst is answered.
        for (row, secs) in notes.too_long {
            let text = texts::too_long_audio_text(secs, d.settings.max_audio_seconds);
            let key = format!("audio-too-long/{}/{row}", batch.conversation);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        let mut prompt = self.prompt(&batch);
        // Read after the claim read `v0`: a change since moved the version, so the
        // final check refuses a reply written with settings older than these.
        let chosen = d.store.conversation_settings(&batch.conversation).await?;
        prompt.choices = d.settings.controls.choices(&chosen);
        prompt.overheard = self.overheard(&batch).await;
        for note in notes.model {
            add_note(&mut prompt, note);
        }
        let fetched = tokio::select! {
            fetched = self.fetch_images(&batch, &mut prompt) => fetched?,
            () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
            () = self.stop.cancelled() => return Err(Interrupt::Stopped),
        };
        let (too_big, left_out) = match fetched {
            Ok(fetched) => fetched,
            Err(error) => {
                rows.extend(self.generation_failed(&batch, error).await?);
                return Ok(());
            }
        };
        for (row, size) in too_big {
            let text = texts::too_big_text(size, d.settings.max_image_bytes);
            let key = format!("image-too-big/{}/{row}", batch.conversation);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        if left_out > 0 {
            let first = batch.pending.first().map_or(0, |m| m.row);
            let key = format!("images-left-out/{}/{first}", batch.conversation);
            let text = texts::too_many_images_text(prompt.images.len(), left_out);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        if prompt
            .note
            .as_deref()
            .is_some_and(|n| n.contains(texts::NO_VISION_NOTE))
        {
            rows.extend(self.no_vision_notice(&batch).await?);
        }

        let Some(reserved) = self.reserve(&batch, &prompt, rows).await? else {
            // Over a budget: the messages wait, held until it resets.
            rows.extend(self.approvals_held(&batch, &approvals).await?);
            return Ok(());
        };
        // The reply may take no more than was reserved for it.
        prompt.max_tokens = reserved.max_tokens();
        let started = Instant::now();
        prompt.turns.extend(approvals.turns);
        let decided = approvals.decided;
        let mut generated = self.generate_acting(&batch, &mut prompt, rows).await?;
        if let Generated::Failed { error, spent } = &generated
            && error.kind() == FailureKind::Refused
            && !prompt.images.is_empty()
        {
            // A model without vision refuses image parts (4xx): answer the text, and
            // tell the user once per conversation that this model cannot see images.
            tracing::warn!(%conversation, error = %error, "the model refused the images; answering the text without them (set LULL_VISION=off for a model without vision)");
            let spent_before = *spent;
            d.images_refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
            prompt.images.clear();
            add_note(&mut prompt, texts::NO_VISION_NOTE);
            rows.extend(self.no_vision_notice(&batch).await?);
            generated = self.generate_acting(&batch, &mut prompt, rows).await?;
            generated.add_spent(spent_before);
        }
        let llm_time = started.elapsed();
        let (generation, spent) = match generated {
            Generated::Reply { generation, spent } => (generation, spent),
            Generated::Failed { error, spent } => {
                // Only what a server reported (earlier tool turns) was spent.
                self.settle(&batch, &reserved, spent).await?;
                if error.kind() == FailureKind::Transient {
                    rows.extend(self.generation_failed(&batch, error).await?);
                } else {
                    rows.extend(self.give_up(&batch, error).await?);
                }
                return Ok(());
            }
            Generated::Stale { version, spent } => {
                self.settle(&batch, &reserved, spent).await?;
                self.count_dropped(&reserved, spent).await?;
                self.stopped_stale(&batch, version);
                return Ok(());
            }
        };
        // Spent whether or not the reply is committed: charged before the final check.
        self.settle(&batch, &reserved, spent).await?;

        // A reply that acted says what it did, whatever the model wrote.
        let report = self.actions_report(&batch, &decided).await?;
        let text = self.bounded_leaving(
            media::quote_transcripts(&batch, generation.text),
            lull_port::split::char_len(&report),
        );
        let reply = NewReply {
            text: text + &lull_port::secrets::redact(report),
            usage: generation.usage,
            llm_ms: llm_time.as_millis() as u64,
            held_out,
        };
        let lease = self.keeper.lease();
        // The final check: lease still ours and nothing new since v0 (or the cap).
        match d
            .store
            .commit_reply(ReplyCommit {
                lease: &lease,
                batch: &batch,
                reply,
                now: d.clock.now(),
            })
            .await?
        {
            CommitOutcome::Committed {
                outbox,
                forced,
                notices,
            } => {
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
                d.emit(Event::Committed {
                    conversation,
                    outbox: outbox.id,
                    v0: batch.v0,
                    batch: batch.pending.len(),
                    forced,
                });
                rows.push(outbox);
                // The notices of members left out, stored after the reply.
                rows.extend(notices);
            }
            CommitOutcome::Stale { version } => {
                metrics::counter!(names::REPLIES_DROPPED_STALE).increment(1);
                self.count_dropped(&reserved, spent).await?;
                tracing::debug!(%conversation, v0 = batch.v0.0, version = version.0, "stale reply dropped: a newer message arrived");
                d.emit(Event::DroppedStale {
                    conversation,
                    v0: batch.v0,
                    version,
                });
            }
        }
        Ok(())
    }

    /// The round stopped before an action because a newer message arrived: nothing
    /// acted on the old picture, and the next round covers everything.
    fn stopped_stale(&self, batch: &Batch, version: crate::domain::Version) {
        let conversation = self.conversation;
        metrics::counter!(names::REPLIES_DROPPED_STALE).increment(1);
        tracing::debug!(%conversation, v0 = batch.v0.0, version = version.0, "round stopped before an action: a newer message arrived");
        self.dispatcher.emit(Event::DroppedStale {
            conversation,
            v0: batch.v0,
            version,
        });
    }

    /// Queue a notice for this batch's conversation, at most once per `dedupe_key`;
    /// the row is returned if it was queued now (this round delivers it).
    async fn notice(
        &self,
        batch: &Batch,
        text: &str,
        dedupe_key: String,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        Ok(Notice::to_batch(batch)
            .queue(d, text, dedupe_key, d.clock.now())
            .await?)
    }
}
