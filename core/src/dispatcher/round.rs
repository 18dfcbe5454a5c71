//! One round for one conversation: claim the lease, collect, generate once, final
//! check, then deliver what the outbox holds. Every step after the claim runs under
//! the lease; a lost lease abandons the round wherever it is.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::drafts::newer_message;
use super::lease_keeper::LeaseKeeper;
use super::{Dispatcher, Event};
use crate::commands;
use crate::domain::{ConversationId, Said, Timestamp};
use crate::limits;
use crate::llm::{FailureKind, Generation, Image, LlmError, Partial, Prompt};
use crate::metrics as names;
use crate::store::{
    Batch, Charged, Claimed, CommitOutcome, NewNotice, NewReply, OutboxRow, ScopeCharge,
    StoreError, TokenCharge,
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

/// The largest audio file sent for transcription: OpenAI's limit for
/// `/audio/transcriptions`.
const MAX_AUDIO_BYTES: u64 = 25 * 1024 * 1024;

const AUDIO_TOO_LONG_NOTE: &str =
    "[A voice message was too long to transcribe; the user has been told.]";
const AUDIO_MISSING_NOTE: &str = "[A voice message could not be transcribed.]";

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

        // Voice first, then images: both before the budget is reserved, so the
        // estimate counts the transcripts (stored once, whatever the budget says).
        let mut batch = batch;
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
        let too_big = match fetched {
            Ok(too_big) => too_big,
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
        if prompt
            .note
            .as_deref()
            .is_some_and(|n| n.contains(NO_VISION_NOTE))
        {
            rows.extend(self.no_vision_notice(&batch).await?);
        }

        let reserved = match self.reserve(&batch, rows).await? {
            Some(reserved) => reserved,
            // Over a budget: the messages wait, held until it resets.
            None => return Ok(()),
        };
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
                self.settle(&batch, reserved, Spent::default()).await?;
                if error.kind() == FailureKind::Transient {
                    rows.extend(self.generation_failed(&batch, error).await?);
                } else {
                    rows.extend(self.give_up(&batch, error).await?);
                }
                return Ok(());
            }
        };
        // Spent whether or not the reply is committed: charged before the final check.
        self.settle(&batch, reserved, Spent::of(&batch, &generation))
            .await?;

        let reply = NewReply {
            text: self.bounded(quote_transcripts(&batch, generation.text)),
            usage: generation.usage,
            llm_ms: llm_time.as_millis() as u64,
        };
        let lease = self.keeper.lease();
        // The final check: lease still ours and nothing new since v0 (or the cap).
        match d
            .store
            .commit_reply(&lease, &batch, reply, d.clock.now())
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
                d.emit(Event::Committed {
                    conversation,
                    outbox: outbox.id,
                    v0: batch.v0,
                    batch: batch.pending.len(),
                    forced,
                });
                rows.push(outbox);
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

    /// Before the model is asked: reserve the most this reply can cost in every budget
    /// it counts against, under the lease (`Some(reserved)`, 0 when no budget is set).
    /// `None`: a budget would be passed; nothing was charged, the store holds the
    /// conversation until the budget resets, and the user is told once (the notice,
    /// if queued now, joins `rows`).
    async fn reserve(
        &self,
        batch: &Batch,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<Option<u64>, Interrupt> {
        let d = self.dispatcher;
        let limits = &d.settings.limits;
        if !limits.has_budget() {
            return Ok(Some(0));
        }
        let now = d.clock.now();
        let reserved = prompt_estimate(batch) + limits.reply_tokens;
        let charge = self.charge(batch, reserved as i64, true, now);
        let (scope, limit) = match d
            .store
            .charge_tokens(&self.keeper.lease(), &charge, now)
            .await?
        {
            Charged::Charged => return Ok(Some(reserved)),
            Charged::Over { scope, limit, .. } => (scope, limit),
        };
        let reason = if scope == limits::BOT_SCOPE {
            "bot_budget"
        } else {
            "user_budget"
        };
        metrics::counter!(names::LIMITED, "reason" => reason).increment(1);
        let conversation = self.conversation;
        tracing::info!(%conversation, %scope, limit, until = charge.hold_until.0, "over a token budget: messages held until it resets");
        d.emit(Event::Limited {
            conversation,
            reason,
            until: charge.hold_until,
        });
        let notice = NewNotice {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            text: commands::budget_text(
                reason == "user_budget",
                limit,
                &limits.timezone.show(charge.hold_until, now),
            ),
            reply_to: batch
                .is_group
                .then(|| batch.last_message_id().map(str::to_owned))
                .flatten(),
            dedupe_key: format!("budget/{scope}/{}/{}", charge.day, batch.conversation),
        };
        rows.extend(d.store.enqueue_notice(notice, &d.holder, now).await?);
        Ok(None)
    }

    /// After the model answered (or failed): turn the reservation into what was
    /// spent, under the lease (no budget checked: the reservation already was).
    async fn settle(&self, batch: &Batch, reserved: u64, spent: Spent) -> Result<(), Interrupt> {
        for (kind, tokens) in [
            ("prompt", spent.prompt),
            ("completion", spent.completion),
            ("estimated", spent.estimated),
        ] {
            if tokens > 0 {
                metrics::counter!(names::TOKENS, "kind" => kind).increment(tokens);
            }
        }
        let delta = spent.total() as i64 - reserved as i64;
        if delta == 0 {
            return Ok(());
        }
        let d = self.dispatcher;
        let now = d.clock.now();
        let charge = self.charge(batch, delta, false, now);
        d.store
            .charge_tokens(&self.keeper.lease(), &charge, now)
            .await?;
        Ok(())
    }

    /// A charge of `tokens` for `batch`: split evenly among its authors (each against
    /// their own budget, admins excepted), the conversation (no budget), and the whole
    /// bot; with `check`, against the budgets.
    fn charge(&self, batch: &Batch, tokens: i64, check: bool, now: Timestamp) -> TokenCharge {
        let d = self.dispatcher;
        let limits = &d.settings.limits;
        let platform = batch.conversation.platform;
        let mut authors: Vec<&str> = batch.pending.iter().map(|m| m.user_id.as_str()).collect();
        authors.sort_unstable();
        authors.dedup();
        let share = tokens.signum() * (tokens.abs() + authors.len() as i64 - 1).max(0)
            / (authors.len() as i64).max(1);
        let limit = |n: u64| (check && n > 0).then_some(n);
        let mut scopes: Vec<ScopeCharge> = authors
            .into_iter()
            .map(|user| ScopeCharge {
                scope: limits::user_scope(platform, user),
                tokens: share,
                limit: if d.settings.access.admins.contains(platform, user) {
                    None
                } else {
                    limit(limits.user_daily_tokens)
                },
            })
            .collect();
        scopes.push(ScopeCharge {
            scope: limits::conversation_scope(&batch.conversation),
            tokens,
            limit: None,
        });
        scopes.push(ScopeCharge {
            scope: limits::BOT_SCOPE.to_owned(),
            tokens,
            limit: limit(limits.daily_tokens),
        });
        TokenCharge {
            day: limits.timezone.day(now),
            scopes,
            hold_until: limits.timezone.next_day(now),
        }
    }

    /// The prompt for `batch`, without images yet.
    fn prompt(&self, batch: &Batch) -> Prompt {
        Prompt {
            conversation: batch.conversation.clone(),
            is_group: batch.is_group,
            history: batch.history.clone(),
            batch: batch
                .pending
                .iter()
                .map(|m| Said::new(&m.author, m.said()))
                .collect(),
            note: None,
            images: Vec::new(),
        }
    }

    /// Fetch the images of the pending batch through the adapter (`LULL_VISION=auto`
    /// only) into `prompt`. An image too large or gone is left out with a note to the
    /// model; the images too large are returned (message row, size) so the user is
    /// told. A transient failure (network, timeout, 5xx)
    /// is `Err`, and the round fails like a model that cannot be reached: the
    /// messages stay pending and are retried with backoff.
    async fn fetch_images(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
    ) -> Result<Result<Vec<(i64, u64)>, LlmError>, Interrupt> {
        let d = self.dispatcher;
        let mut too_big = Vec::new();
        if !d.settings.vision {
            return Ok(Ok(too_big));
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
            return Ok(Ok(too_big));
        }
        let Some(outbound) = d.outbounds.get(&batch.conversation.platform) else {
            return Ok(Ok(too_big));
        };
        let max = d.settings.max_image_bytes;
        let attempts = batch.timer.map_or(0, |t| t.attempts);
        for message in &batch.pending {
            for media in message.media.iter().filter(|m| m.kind == MediaKind::Image) {
                let fetched =
                    tokio::time::timeout(MEDIA_FETCH_TIMEOUT, outbound.fetch_media(media, max))
                        .await
                        .unwrap_or_else(|_| {
                            Err(MediaError::Transient(format!(
                                "no answer within {MEDIA_FETCH_TIMEOUT:?}"
                            )))
                        });
                match fetched {
                    Ok(fetched) => prompt.images.push(Image {
                        mime: fetched.mime,
                        bytes: fetched.bytes.into(),
                    }),
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
        Ok(Ok(too_big))
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
            let transcript = match transcriber.transcribe(&audio.bytes, &audio.mime).await {
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

/// Tokens a generation spent, by kind (`lull_tokens_total`).
#[derive(Debug, Clone, Copy, Default)]
struct Spent {
    prompt: u64,
    completion: u64,
    estimated: u64,
}

impl Spent {
    /// What `generation` spent: the model's reported usage, else an estimate from the
    /// prompt's and the reply's characters.
    fn of(batch: &Batch, generation: &Generation) -> Spent {
        match generation.usage {
            Some(usage) => Spent {
                prompt: usage.prompt,
                completion: usage.completion,
                estimated: 0,
            },
            None => Spent {
                estimated: prompt_estimate(batch)
                    + limits::estimate_tokens(lull_port::split::char_len(&generation.text)),
                ..Spent::default()
            },
        }
    }

    fn total(self) -> u64 {
        self.prompt + self.completion + self.estimated
    }
}

/// The prompt's tokens, estimated from its characters (history and batch).
fn prompt_estimate(batch: &Batch) -> u64 {
    let chars: usize =
        batch
            .history
            .iter()
            .map(|e| {
                e.user
                    .iter()
                    .map(|s| {
                        lull_port::split::char_len(&s.author) + lull_port::split::char_len(&s.text)
                    })
                    .sum::<usize>()
                    + lull_port::split::char_len(&e.reply)
            })
            .chain(batch.pending.iter().map(|m| {
                lull_port::split::char_len(&m.author) + lull_port::split::char_len(&m.said())
            }))
            .sum();
    limits::estimate_tokens(chars)
}

/// `text` cut to at most `max` characters (at a paragraph, line or word), with a note
/// saying so; `None` when it fits. Replies and their drafts are cut alike.
pub(super) fn cut(text: &str, max: usize) -> Option<String> {
    lull_port::split::truncate(text, max, &format!("[… reply cut at {max} characters]"))
}
