//! One round for one conversation: claim the lease, collect, generate once, final
//! check, then deliver what the outbox holds. Every step after the claim runs under
//! the lease; a lost lease abandons the round wherever it is.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::drafts::newer_message;
use super::lease_keeper::LeaseKeeper;
use super::wallet::{self, Spent};
use super::{Dispatcher, Event};
use crate::domain::{ConversationId, Said};
use crate::limits;
use crate::llm::{FailureKind, Generation, Image, LlmError, Partial, Prompt};
use crate::metrics as names;
use crate::store::{
    Batch, Claimed, CommitOutcome, NewNotice, NewReply, OutboxRow, PendingMessage, StoreError,
};
use crate::timing::FAILURE_BACKOFF;
use lull_port::{MediaError, MediaKind};

/// Why a step ended the round early.
pub(super) enum Interrupt {
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

/// How long fetching one image may take before the round counts it as a transient
/// failure (adapters have their own, shorter, limits per request).
const MEDIA_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Rounds in a row whose media fetch failed transiently before the batch is answered
/// without that media (with a note to the model): a platform's file server that stays
/// down never holds a conversation's messages for good.
const MEDIA_ATTEMPTS: u32 = 3;

/// What the user is told when the model refused the images of a batch: once per
/// conversation.
const NO_VISION_TEXT: &str = "Note: the language model I use cannot see images, \
so I answered only the text of your messages.";

/// What the model is told when it was sent no images although the user sent some.
const NO_VISION_NOTE: &str = "[The user sent an image, but it could not be shown to you: \
answer the text.]";
const TOO_BIG_NOTE: &str = "[An image the user sent was too large to read; they have been told.]";
const GONE_NOTE: &str = "[An image the user sent could not be fetched.]";
const TOO_MANY_NOTE: &str = "[The user sent more images than you can be shown at once; \
only the first ones are attached, and the user has been told.]";

/// What the user is told when a batch had more images than one reply reads
/// ([`limits::MAX_IMAGES_PER_PROMPT`], [`limits::MAX_IMAGE_BYTES_PER_ROUND`]).
fn too_many_images_text(shown: usize, left_out: usize) -> String {
    format!(
        "Note: I can look at {} images at once ({} MB in all), so I answered with the first {shown} \
and left {left_out} out. Please send the others again if they matter.",
        limits::MAX_IMAGES_PER_PROMPT,
        limits::MAX_IMAGE_BYTES_PER_ROUND / (1024 * 1024)
    )
}

/// The largest audio file sent for transcription: OpenAI's limit for
/// `/audio/transcriptions`.
const MAX_AUDIO_BYTES: u64 = 25 * 1024 * 1024;

const AUDIO_TOO_LONG_NOTE: &str =
    "[A voice message was too long to transcribe; the user has been told.]";
const AUDIO_MISSING_NOTE: &str = "[A voice message could not be transcribed.]";
const AUDIO_NO_BUDGET_NOTE: &str =
    "[A voice message was not transcribed: its sender's token budget for today is spent.]";

/// What transcribing a batch left to say: to the user (voice messages too long, as
/// message row and seconds) and to the model.
#[derive(Default)]
struct AudioNotes {
    too_long: Vec<(i64, u32)>,
    model: Vec<&'static str>,
}

/// What the user is told about a voice message longer than `LULL_MAX_AUDIO_SECONDS`.
fn too_long_audio_text(secs: u32, max: u32) -> String {
    let length = if secs > 0 {
        format!("{secs} s; ")
    } else {
        String::new()
    };
    format!(
        "Sorry, your voice message is too long for me to transcribe ({length}the limit is {max} s). \
I answered the rest of your messages; please send it in shorter parts or as text."
    )
}

/// What the user is told about an image larger than `LULL_MAX_IMAGE_BYTES`.
fn too_big_text(size: u64, max: u64) -> String {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / (1024.0 * 1024.0));
    format!(
        "Sorry, your image is too large for me to look at ({}; the limit is {}). \
I answered the rest of your messages; please send a smaller version if it matters.",
        mb(size),
        mb(max)
    )
}

/// The longest transcript stored: a 300-second voice note is a few thousand words, so
/// anything longer is a misbehaving server, cut rather than carried into every prompt.
const MAX_TRANSCRIPT_CHARS: usize = 20_000;

/// How much of a transcript a reply quotes.
const QUOTED_TRANSCRIPT_CHARS: usize = 300;

/// In a group, a reply to voice messages opens with what was heard (`> 🎤 author:
/// transcript`, cut to [`QUOTED_TRANSCRIPT_CHARS`]): the others in the chat see what
/// the bot answers without playing the recording, and the speaker sees how it was
/// understood. In a private chat the speaker knows what they said: no quote.
fn quote_transcripts(batch: &Batch, reply: String) -> String {
    if !batch.is_group {
        return reply;
    }
    let quotes: Vec<String> = batch
        .pending
        .iter()
        .filter_map(|m| {
            let transcript = m.transcript.as_deref()?;
            let cut = lull_port::split::truncate(transcript, QUOTED_TRANSCRIPT_CHARS, "…")
                .unwrap_or_else(|| transcript.to_owned());
            Some(format!("> 🎤 {}: {}", m.author, cut.replace('\n', " ")))
        })
        .collect();
    if quotes.is_empty() {
        return reply;
    }
    format!("{}\n\n{reply}", quotes.join("\n"))
}

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
        .claim_round(
            conversation,
            &d.holder,
            d.settings.lease.ttl(),
            d.settings.history,
            claimed_at,
        )
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
                    .disarm_idle_timer(&self.keeper.lease(), batch.v0, now)
                    .await?;
            }
            return Ok(());
        }
        if batch.timer.is_some_and(|t| t.due_at > now) {
            return Ok(());
        }

        // Who pays: in a group, a member whose budget cannot pay their share of a
        // reply is left out, and a notice answers their messages with the reply
        // (see `wallet`); what they sent is neither transcribed nor fetched.
        let collected = batch;
        let over = wallet::members_over(
            d,
            &collected,
            |messages| self.prompt_of(&collected, messages),
            now,
        )
        .await?;
        let held_out: Vec<_> = over
            .iter()
            .map(|member| member.held_out(d, &collected, now))
            .collect();
        let mut batch = collected.clone();
        batch
            .pending
            .retain(|m| !over.iter().any(|o| o.user_id == m.user_id));
        if batch.pending.is_empty() {
            // Every member who wrote is over their budget: each is told, and the
            // notice ends the batch, so the group is not held for them.
            metrics::counter!(names::LIMITED, "reason" => "user_budget").increment(1);
            let text = wallet::refusal_text(d, &over, now);
            rows.extend(
                d.store
                    .give_up(&self.keeper.lease(), &collected, &text, d.clock.now())
                    .await?,
            );
            return Ok(());
        }

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
            let text = too_long_audio_text(secs, d.settings.max_audio_seconds);
            let key = format!("audio-too-long/{}/{row}", batch.conversation);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        let mut prompt = self.prompt(&batch);
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
            let text = too_big_text(size, d.settings.max_image_bytes);
            let key = format!("image-too-big/{}/{row}", batch.conversation);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        if left_out > 0 {
            let first = batch.pending.first().map_or(0, |m| m.row);
            let key = format!("images-left-out/{}/{first}", batch.conversation);
            let text = too_many_images_text(prompt.images.len(), left_out);
            rows.extend(self.notice(&batch, &text, key).await?);
        }
        if prompt
            .note
            .as_deref()
            .is_some_and(|n| n.contains(NO_VISION_NOTE))
        {
            rows.extend(self.no_vision_notice(&batch).await?);
        }

        let lease = self.keeper.lease();
        let reserved =
            match wallet::reserve(d, &lease, &batch, &prompt, rows, d.clock.now()).await? {
                Some(reserved) => reserved,
                // Over a budget: the messages wait, held until it resets.
                None => return Ok(()),
            };
        // The reply may take no more than was reserved for it.
        prompt.max_tokens = reserved.max_tokens();
        let started = Instant::now();
        let mut generated = tokio::select! {
            generated = self.generate(&batch, &prompt) => generated,
            () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
            () = self.stop.cancelled() => return Err(Interrupt::Stopped),
        };
        if let Err(error) = &generated
            && error.kind() == FailureKind::Refused
            && !prompt.images.is_empty()
        {
            // A model without vision refuses image parts (4xx): answer the text, and
            // tell the user once per conversation that this model cannot see images.
            tracing::warn!(%conversation, error = %error, "the model refused the images; answering the text without them (set LULL_VISION=off for a model without vision)");
            d.images_refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
            prompt.images.clear();
            add_note(&mut prompt, NO_VISION_NOTE);
            rows.extend(self.no_vision_notice(&batch).await?);
            generated = tokio::select! {
                generated = self.generate(&batch, &prompt) => generated,
                () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
                () = self.stop.cancelled() => return Err(Interrupt::Stopped),
            };
        }
        let llm_time = started.elapsed();
        let generation = match generated {
            Ok(generation) => generation,
            Err(error) => {
                // Nothing was spent that any server reported: give the reservation back.
                wallet::settle(
                    d,
                    &self.keeper.lease(),
                    &batch,
                    &reserved,
                    Spent::default(),
                    d.clock.now(),
                )
                .await?;
                if error.kind() == FailureKind::Transient {
                    rows.extend(self.generation_failed(&batch, error).await?);
                } else {
                    rows.extend(self.give_up(&batch, error).await?);
                }
                return Ok(());
            }
        };
        // Spent whether or not the reply is committed: charged before the final check.
        let spent = Spent::of(&d.settings.limits, &prompt, &generation);
        wallet::settle(
            d,
            &self.keeper.lease(),
            &batch,
            &reserved,
            spent,
            d.clock.now(),
        )
        .await?;

        let reply = NewReply {
            text: self.bounded(quote_transcripts(&batch, generation.text)),
            usage: generation.usage,
            llm_ms: llm_time.as_millis() as u64,
            held_out,
        };
        let lease = self.keeper.lease();
        // The final check: lease still ours and nothing new since v0 (or the cap).
        match d
            .store
            .commit_reply(&lease, &batch, reply, d.clock.now())
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

    /// The prompt for `batch`, without images yet.
    fn prompt(&self, batch: &Batch) -> Prompt {
        self.prompt_of(batch, &batch.pending)
    }

    /// The prompt for `messages` of `batch`, without images yet.
    fn prompt_of(&self, batch: &Batch, messages: &[PendingMessage]) -> Prompt {
        Prompt {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            history: batch.history.clone(),
            batch: messages
                .iter()
                .map(|m| Said::new(&m.author, m.said()))
                .collect(),
            note: None,
            images: Vec::new(),
            max_tokens: None,
        }
    }

    /// Fetch the images of the pending batch through the adapter (`LULL_VISION=auto`
    /// only) into `prompt`. An image too large or gone is left out with a note to the
    /// model; the images too large are returned (message row, size) so the user is
    /// told, with how many were left out because the round had read its
    /// [`limits::MAX_IMAGES_PER_PROMPT`] images or [`limits::MAX_IMAGE_BYTES_PER_ROUND`]
    /// bytes. A transient failure (network, timeout, 5xx)
    /// is `Err`, and the round fails like a model that cannot be reached: the
    /// messages stay pending and are retried with backoff.
    async fn fetch_images(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
    ) -> Result<Result<(Vec<(i64, u64)>, usize), LlmError>, Interrupt> {
        let d = self.dispatcher;
        let mut too_big = Vec::new();
        if !d.settings.vision {
            return Ok(Ok((too_big, 0)));
        }
        let has_images = || {
            batch
                .pending
                .iter()
                .any(|m| m.media.iter().any(|m| m.kind == MediaKind::Image))
        };
        if d.images_refused.load(std::sync::atomic::Ordering::Relaxed) && has_images() {
            // This model refused images earlier: not fetched, not sent.
            add_note(prompt, NO_VISION_NOTE);
            return Ok(Ok((too_big, 0)));
        }
        let Some(outbound) = d.outbounds.get(&batch.conversation.platform) else {
            return Ok(Ok((too_big, 0)));
        };
        let attempts = batch.timer.map_or(0, |t| t.attempts);
        // What one round may fetch and send: MAX_IMAGES_PER_PROMPT images, and
        // MAX_IMAGE_BYTES_PER_ROUND bytes together; the rest are left out, with a
        // note to the model (the user is told once).
        let mut round_bytes = 0u64;
        let mut left_out = 0usize;
        for message in &batch.pending {
            for media in message.media.iter().filter(|m| m.kind == MediaKind::Image) {
                let room = limits::MAX_IMAGE_BYTES_PER_ROUND.saturating_sub(round_bytes);
                if prompt.images.len() >= limits::MAX_IMAGES_PER_PROMPT || room == 0 {
                    left_out += 1;
                    continue;
                }
                let max = d.settings.max_image_bytes.min(room);
                let fetched =
                    tokio::time::timeout(MEDIA_FETCH_TIMEOUT, outbound.fetch_media(media, max))
                        .await
                        .unwrap_or_else(|_| {
                            Err(MediaError::Transient(format!(
                                "no answer within {MEDIA_FETCH_TIMEOUT:?}"
                            )))
                        });
                match fetched {
                    Ok(fetched) => {
                        round_bytes += fetched.bytes.len() as u64;
                        prompt.images.push(Image {
                            mime: fetched.mime,
                            bytes: fetched.bytes.into(),
                        });
                    }
                    // Within LULL_MAX_IMAGE_BYTES, but past what the round has left.
                    Err(MediaError::TooBig { size, .. }) if size <= d.settings.max_image_bytes => {
                        left_out += 1;
                    }
                    Err(MediaError::TooBig { size, max }) => {
                        tracing::info!(conversation = %batch.conversation, size, max, "an image is larger than LULL_MAX_IMAGE_BYTES; not read");
                        add_note(prompt, TOO_BIG_NOTE);
                        too_big.push((message.row, size));
                    }
                    Err(MediaError::Transient(why)) if attempts < MEDIA_ATTEMPTS => {
                        return Ok(Err(LlmError::Connect(format!(
                            "fetching an image from {}: {why}",
                            batch.conversation.platform
                        ))));
                    }
                    // Gone, or still failing after as many rounds: answered without it.
                    Err(MediaError::Gone(why) | MediaError::Transient(why)) => {
                        tracing::warn!(conversation = %batch.conversation, error = %why, "an image could not be fetched; answering without it");
                        add_note(prompt, GONE_NOTE);
                    }
                }
            }
        }
        if left_out > 0 {
            tracing::info!(conversation = %batch.conversation, shown = prompt.images.len(), left_out, "more images than one reply reads; the rest left out");
            add_note(prompt, TOO_MANY_NOTE);
        }
        Ok(Ok((too_big, left_out)))
    }

    /// Transcribe the voice notes and audio files of the pending batch that have no
    /// transcript yet, storing each transcript under the lease before the next, so a
    /// crash never costs a transcription twice. Audio longer than
    /// `LULL_MAX_AUDIO_SECONDS` (or larger than the server takes) is not sent, and the
    /// user is told; a transient failure (fetching or transcribing) is `Err`, and the
    /// round is retried like a model that cannot be reached.
    async fn transcribe(
        &self,
        batch: &mut Batch,
    ) -> Result<Result<AudioNotes, LlmError>, Interrupt> {
        let d = self.dispatcher;
        let mut notes = AudioNotes::default();
        let (Some(transcriber), Some(outbound)) = (
            d.transcriber.get(),
            d.outbounds.get(&batch.conversation.platform),
        ) else {
            return Ok(Ok(notes));
        };
        let max_secs = d.settings.max_audio_seconds;
        let attempts = batch.timer.map_or(0, |t| t.attempts);
        let conversation = batch.conversation.clone();
        for message in &mut batch.pending {
            if message.transcript.is_some() {
                continue;
            }
            let Some(media) = message.media.iter().find(|m| m.kind.is_audio()) else {
                continue;
            };
            if let Some(secs) = media.duration_secs.filter(|&s| s > max_secs) {
                notes.too_long.push((message.row, secs));
                notes.model.push(AUDIO_TOO_LONG_NOTE);
                continue;
            }
            let fetched = tokio::time::timeout(
                MEDIA_FETCH_TIMEOUT,
                outbound.fetch_media(media, MAX_AUDIO_BYTES),
            )
            .await
            .unwrap_or_else(|_| {
                Err(MediaError::Transient(format!(
                    "no answer within {MEDIA_FETCH_TIMEOUT:?}"
                )))
            });
            let audio = match fetched {
                Ok(audio) => audio,
                Err(MediaError::TooBig { .. }) => {
                    notes
                        .too_long
                        .push((message.row, media.duration_secs.unwrap_or(0)));
                    notes.model.push(AUDIO_TOO_LONG_NOTE);
                    continue;
                }
                Err(MediaError::Transient(why)) if attempts < MEDIA_ATTEMPTS => {
                    return Ok(Err(LlmError::Connect(format!(
                        "fetching a voice message from {}: {why}",
                        batch.conversation.platform
                    ))));
                }
                // Gone, or still failing after as many rounds: answered without it.
                Err(MediaError::Gone(why) | MediaError::Transient(why)) => {
                    tracing::warn!(conversation = %batch.conversation, error = %why, "a voice message could not be fetched; answering without it");
                    notes.model.push(AUDIO_MISSING_NOTE);
                    continue;
                }
            };
            // Budgets: a transcription is charged to its sender and the bot before it
            // is asked for (by its length, else by its size), and given back if it fails.
            let secs = media.duration_secs.map_or_else(
                || (audio.bytes.len() as u64).div_ceil(limits::AUDIO_BYTES_PER_SECOND),
                u64::from,
            );
            let lease = self.keeper.lease();
            let now = d.clock.now();
            if !wallet::charge_transcription(d, &lease, &conversation, &message.user_id, secs, now)
                .await?
            {
                tracing::info!(conversation = %batch.conversation, user = %message.user_id, secs, "not enough left of a token budget to transcribe a voice message; answering without it");
                notes.model.push(AUDIO_NO_BUDGET_NOTE);
                continue;
            }
            let transcribed = transcriber.transcribe(&audio.bytes, &audio.mime).await;
            if transcribed.is_err() {
                wallet::refund_transcription(
                    d,
                    &lease,
                    &conversation,
                    &message.user_id,
                    secs,
                    d.clock.now(),
                )
                .await?;
            }
            let transcript = match transcribed {
                // A runaway answer is cut: the transcript enters every later prompt.
                Ok(transcript) => lull_port::split::truncate(
                    &transcript,
                    MAX_TRANSCRIPT_CHARS,
                    "[transcript cut]",
                )
                .unwrap_or(transcript),
                Err(error) if error.is_retryable() => return Ok(Err(error)),
                Err(error) => {
                    tracing::error!(conversation = %batch.conversation, error = %error, "the transcription server refused a voice message; answering without it (check LULL_TRANSCRIBE_MODEL and LULL_TRANSCRIBE_BASE_URL)");
                    notes.model.push(AUDIO_MISSING_NOTE);
                    continue;
                }
            };
            d.store
                .store_transcript(
                    &self.keeper.lease(),
                    message.row,
                    &transcript,
                    d.clock.now(),
                )
                .await?;
            tracing::info!(conversation = %batch.conversation, chars = transcript.chars().count(), "voice message transcribed");
            message.transcript = Some(transcript);
        }
        Ok(Ok(notes))
    }

    /// Tell the conversation once that the model cannot see images.
    async fn no_vision_notice(&self, batch: &Batch) -> Result<Option<OutboxRow>, Interrupt> {
        let key = format!("no-vision/{}", batch.conversation);
        self.notice(batch, NO_VISION_TEXT, key).await
    }

    /// Queue a notice for this batch's conversation, at most once per `dedupe_key`;
    /// the row is returned if it was queued now.
    async fn notice(
        &self,
        batch: &Batch,
        text: &str,
        dedupe_key: String,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        let notice = NewNotice {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            text: text.to_owned(),
            reply_to: None,
            dedupe_key,
        };
        Ok(d.store
            .enqueue_notice(notice, &d.holder, d.clock.now())
            .await?)
    }

    /// Ask the model once, showing the reply as a live draft while it is written
    /// where the platform has drafts, else "typing…".
    async fn generate(&self, batch: &Batch, prompt: &Prompt) -> Result<Generation, LlmError> {
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
                // Subscribed before the model is asked: a message stored from now on
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
            generated = d.responder.respond(prompt, &partial) => generated,
            never = shown => never,
        }
    }

    /// A reply as it may be committed, whichever responder wrote it: without any
    /// registered secret, and at most `max_reply_chars` long (cut at a paragraph, line
    /// or word, with a note saying so).
    fn bounded(&self, text: String) -> String {
        let conversation = self.conversation;
        let text = lull_port::secrets::redact(text);
        let max = self.dispatcher.settings.max_reply_chars;
        match cut(&text, max) {
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
        error: LlmError,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let text = if error.kind() == FailureKind::TooLong {
            tracing::warn!(%conversation, batch = batch.pending.len(), error = %error, "the messages are too long for the model even when cut; telling the user and moving on (if short prompts are refused too, check {})", error.setting());
            TOO_LONG_TEXT
        } else {
            tracing::error!(%conversation, batch = batch.pending.len(), error = %error, "the model server refused the request; telling the user and moving on. Check {}", error.setting());
            REFUSED_TEXT
        };
        let given_up = d
            .store
            .give_up(&self.keeper.lease(), batch, text, d.clock.now())
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
    async fn generation_failed(
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
            .record_failure(&self.keeper.lease(), retry_at, now)
            .await?;
        tracing::warn!(%conversation, attempts, error = %error, retry_in_ms = now.until(retry_at).as_millis() as u64, "generation failed; messages stay pending");
        d.emit(Event::GenerationFailed {
            conversation,
            attempts,
            error: error.to_string(),
        });
        let first = batch.pending.first().map_or(0, |m| m.row);
        let dedupe_key = format!("model-down/{}/{first}", batch.conversation);
        self.notice(batch, MODEL_DOWN_TEXT, dedupe_key).await
    }
}

/// `text` cut to at most `max` characters (at a paragraph, line or word), with a note
/// saying so; `None` when it fits. Replies and their drafts are cut alike.
pub(super) fn cut(text: &str, max: usize) -> Option<String> {
    lull_port::split::truncate(text, max, &format!("[… reply cut at {max} characters]"))
}
