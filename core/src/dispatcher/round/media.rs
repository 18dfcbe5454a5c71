//! What a round reads of a batch's media before the model is asked, its stages
//! **transcribe** and **images**: voice messages transcribed (each transcript stored under the lease before the next, charged to
//! its sender first), then images fetched through the adapter within the round's
//! bounds. What could not be read is told: to the model as a note, to the user once.

use lull_port::{ConversationRef, Media, MediaBytes, MediaError, MediaKind, Outbound};

use super::{Answering, Ending, Flow, Interrupt, Round, add_note};
use crate::dispatcher::wallet;
use crate::limits;
use crate::llm::transcribe::Transcriber;
use crate::llm::{Image, LlmError, Prompt};
use crate::store::{Batch, OutboxRow, PendingMessage, TranscriptWrite};
use crate::texts;

/// How long fetching one image may take before the round counts it as a transient
/// failure (adapters have their own, shorter, limits per request).
const MEDIA_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Rounds in a row whose media fetch failed transiently before the batch is answered
/// without that media (with a note to the model): a platform's file server that stays
/// down never holds a conversation's messages for good.
const MEDIA_ATTEMPTS: u32 = 3;

/// The largest audio file sent for transcription: OpenAI's limit for
/// `/audio/transcriptions`.
const MAX_AUDIO_BYTES: u64 = 25 * 1024 * 1024;

/// What transcribing a batch left to say: to the user (voice messages too long, as
/// message row and seconds) and to the model.
#[derive(Default)]
pub(super) struct AudioNotes {
    pub(super) too_long: Vec<(i64, u32)>,
    pub(super) model: Vec<&'static str>,
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
pub(super) fn quote_transcripts(batch: &Batch, reply: String) -> String {
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
            Some(texts::transcript_quote(&m.author, &cut.replace('\n', " ")))
        })
        .collect();
    if quotes.is_empty() {
        return reply;
    }
    format!("{}\n\n{reply}", quotes.join("\n"))
}

impl Round<'_> {
    /// The `transcribe` stage: before the budget is reserved, so the estimate counts
    /// the transcripts (stored once, whatever the budget says). A voice message too
    /// long is told plainly, once per message; the rest of the burst is answered.
    pub(super) async fn transcribe_batch(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        a.audio = match self.transcribe(&mut a.batch).await? {
            Ok(notes) => notes,
            Err(error) => return Ok(Flow::End(Ending::Unread(error))),
        };
        for &(row, secs) in &a.audio.too_long {
            let text = texts::too_long_audio_text(secs, d.settings.max_audio_seconds);
            let key = format!("audio-too-long/{}/{row}", a.batch.conversation);
            a.rows.extend(self.notice(&a.batch, text, key).await?);
        }
        Ok(Flow::Go)
    }

    /// The `images` stage: the batch's images into the prompt; an image too big, or
    /// more than one reply reads, is told once; a model known to refuse images says so.
    pub(super) async fn images(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        let (too_big, left_out) = match self.fetch_images(&a.batch, &mut a.prompt).await? {
            Ok(fetched) => fetched,
            Err(error) => return Ok(Flow::End(Ending::Unread(error))),
        };
        let batch = &a.batch;
        for (row, size) in too_big {
            let text = texts::too_big_text(size, d.settings.max_image_bytes);
            let key = format!("image-too-big/{}/{row}", batch.conversation);
            a.rows.extend(self.notice(batch, text, key).await?);
        }
        if left_out > 0 {
            let first = batch.pending.first().map_or(0, |m| m.row);
            let key = format!("images-left-out/{}/{first}", batch.conversation);
            let text = texts::too_many_images_text(a.prompt.images.len(), left_out);
            a.rows.extend(self.notice(batch, text, key).await?);
        }
        if a.prompt
            .note
            .as_deref()
            .is_some_and(|n| n.contains(texts::NO_VISION_NOTE))
        {
            a.rows.extend(self.no_vision_notice(batch).await?);
        }
        Ok(Flow::Go)
    }

    /// Fetch the images of the pending batch through the adapter (`LULL_VISION=auto`
    /// only) into `prompt`. An image too large or gone is left out with a note to the
    /// model; the images too large are returned (message row, size) so the user is
    /// told, with how many were left out because the round had read its
    /// [`limits::MAX_IMAGES_PER_PROMPT`] images or [`limits::MAX_IMAGE_BYTES_PER_ROUND`]
    /// bytes. A transient failure (network, timeout, 5xx)
    /// is `Err`, and the round fails like a model that cannot be reached: the
    /// messages stay pending and are retried with backoff.
    pub(super) async fn fetch_images(
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
            add_note(prompt, texts::NO_VISION_NOTE);
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
                        add_note(prompt, texts::TOO_BIG_NOTE);
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
                        add_note(prompt, texts::GONE_NOTE);
                    }
                }
            }
        }
        if left_out > 0 {
            tracing::info!(conversation = %batch.conversation, shown = prompt.images.len(), left_out, "more images than one reply reads; the rest left out");
            add_note(prompt, texts::TOO_MANY_NOTE);
        }
        Ok(Ok((too_big, left_out)))
    }

    /// Transcribe the voice notes and audio files of the pending batch that have no
    /// transcript yet, storing each transcript under the lease before the next, so a
    /// crash never costs a transcription twice. Audio longer than
    /// `LULL_MAX_AUDIO_SECONDS` (or larger than the server takes) is not sent, and the
    /// user is told; a transient failure (fetching or transcribing) is `Err`, and the
    /// round is retried like a model that cannot be reached.
    pub(super) async fn transcribe(
        &self,
        batch: &mut Batch,
    ) -> Result<Result<AudioNotes, LlmError>, Interrupt> {
        let d = self.dispatcher;
        let mut notes = AudioNotes::default();
        let (Some(transcriber), Some(outbound)) = (
            d.transcriber.as_ref(),
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
                notes.model.push(texts::AUDIO_TOO_LONG_NOTE);
                continue;
            }
            let heard = match self
                .fetch_audio(
                    outbound.as_ref(),
                    (&conversation, message),
                    media,
                    attempts,
                    &mut notes,
                )
                .await
            {
                Ok(Some(audio)) => {
                    self.transcribe_paid(
                        transcriber.as_ref(),
                        (&conversation, message),
                        media,
                        &audio,
                        &mut notes,
                    )
                    .await?
                }
                Ok(None) => continue,
                Err(error) => Err(error),
            };
            let transcript = match heard {
                Ok(Some(transcript)) => transcript,
                Ok(None) => continue,
                Err(error) => return Ok(Err(error)),
            };
            d.store
                .store_transcript(TranscriptWrite {
                    lease: &self.keeper.lease(),
                    message: message.row,
                    transcript: &transcript,
                    now: d.clock.now(),
                })
                .await?;
            tracing::info!(conversation = %conversation, chars = transcript.chars().count(), "voice message transcribed");
            message.transcript = Some(transcript);
        }
        Ok(Ok(notes))
    }

    /// Fetch a voice message's audio. `Ok(None)`: answered without it (too large, gone,
    /// or still failing after [`MEDIA_ATTEMPTS`] rounds), with a note; `Err`: a
    /// transient failure, retried with the round.
    async fn fetch_audio(
        &self,
        outbound: &dyn Outbound,
        (conversation, message): (&ConversationRef, &PendingMessage),
        media: &Media,
        attempts: u32,
        notes: &mut AudioNotes,
    ) -> Result<Option<MediaBytes>, LlmError> {
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
        match fetched {
            Ok(audio) => Ok(Some(audio)),
            Err(MediaError::TooBig { .. }) => {
                let secs = media.duration_secs.unwrap_or(0);
                notes.too_long.push((message.row, secs));
                notes.model.push(texts::AUDIO_TOO_LONG_NOTE);
                Ok(None)
            }
            Err(MediaError::Transient(why)) if attempts < MEDIA_ATTEMPTS => {
                Err(LlmError::Connect(format!(
                    "fetching a voice message from {}: {why}",
                    outbound.platform()
                )))
            }
            // Gone, or still failing after as many rounds: answered without it.
            Err(MediaError::Gone(why) | MediaError::Transient(why)) => {
                tracing::warn!(%conversation, error = %why, "a voice message could not be fetched; answering without it");
                notes.model.push(texts::AUDIO_MISSING_NOTE);
                Ok(None)
            }
        }
    }

    /// Transcribe `audio`, charged to its sender and the bot before it is asked for
    /// (by its length, else by its size) and given back if it fails. `Ok(Ok(None))`:
    /// answered without it (no budget left, or the server refused it), with a note;
    /// `Ok(Err)`: a transient failure, retried with the round. A runaway answer is
    /// cut: the transcript enters every later prompt.
    async fn transcribe_paid(
        &self,
        transcriber: &dyn Transcriber,
        (conversation, message): (&ConversationRef, &PendingMessage),
        media: &Media,
        audio: &MediaBytes,
        notes: &mut AudioNotes,
    ) -> Result<Result<Option<String>, LlmError>, Interrupt> {
        let d = self.dispatcher;
        let user = &message.user_id;
        let secs = media.duration_secs.map_or_else(
            || (audio.bytes.len() as u64).div_ceil(limits::AUDIO_BYTES_PER_SECOND),
            u64::from,
        );
        let lease = self.keeper.lease();
        // A refund goes back to the day (and month) the charge went to, even past
        // midnight.
        let charged_at = d.clock.now();
        if !wallet::charge_transcription(d, &lease, conversation, user, secs, charged_at).await? {
            tracing::info!(%conversation, %user, secs, "not enough left of a token budget to transcribe a voice message; answering without it");
            notes.model.push(texts::AUDIO_NO_BUDGET_NOTE);
            return Ok(Ok(None));
        }
        let transcribed = transcriber.transcribe(&audio.bytes, &audio.mime).await;
        if transcribed.is_err() {
            wallet::refund_transcription(d, &lease, conversation, user, secs, charged_at).await?;
        }
        Ok(match transcribed {
            Ok(transcript) => Ok(Some(
                lull_port::split::truncate(
                    &transcript,
                    MAX_TRANSCRIPT_CHARS,
                    texts::TRANSCRIPT_CUT_NOTE,
                )
                .unwrap_or(transcript),
            )),
            Err(error) if error.is_retryable() => Err(error),
            Err(error) => {
                tracing::error!(%conversation, error = %error, "the transcription server refused a voice message; answering without it (check LULL_TRANSCRIBE_MODEL and LULL_TRANSCRIBE_BASE_URL)");
                notes.model.push(texts::AUDIO_MISSING_NOTE);
                Ok(None)
            }
        })
    }

    /// Tell the conversation once that the model cannot see images.
    pub(super) async fn no_vision_notice(
        &self,
        batch: &Batch,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let key = format!("no-vision/{}", batch.conversation);
        self.notice(batch, texts::NO_VISION_TEXT, key).await
    }
}
