//! Sending replies to Discord over REST, from any lull process (no gateway needed).
//!
//! Every part is created with a `nonce` derived from its outbox row and part index
//! and `enforce_nonce: true`: Discord does not create a second message with a nonce
//! its author used within the last few minutes, and returns the first one instead.
//! So a part sent, then retried because the process crashed before recording it,
//! appears once. (After more than a few minutes the window has closed; the core's
//! recovery runs within a lease TTL, well inside it.)
//!
//! A part with quick replies carries them as buttons (`components`: action rows of
//! at most 5 buttons, at most 5 rows), each with the reply's text as its `custom_id`
//! (at most 100 characters; a longer reply gets no button, the text still says how to
//! answer). A click arrives on the gateway as an interaction (see `gateway`).
//!
//! The ack reaction is `PUT /channels/{c}/messages/{m}/reactions/{emoji}/@me` and is
//! taken off with `DELETE` on the same path (both 204). They need the Add Reactions
//! and Read Message History permissions; a channel without them answers 403.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use serenity::all::ChannelId;
use serenity::http::{LightMethod, Request, Route};

use super::{ChannelKinds, MAX_MESSAGE_CHARS, Rest, channel_of};
use lull_port::domain::{ConversationRef, OutboxId, Platform};
use lull_port::{Media, MediaBytes, MediaError, Outbound, OutgoingPart, QuickReply, SendError};

/// Discord's typing indicator lasts about 10 seconds; refresh it before it lapses.
const TYPING_EVERY: Duration = Duration::from_secs(8);
/// Discord accepts nonces of at most 25 characters.
const MAX_NONCE_CHARS: usize = 25;
/// A button's `custom_id`: 1 to 100 characters.
pub(super) const MAX_CUSTOM_ID_CHARS: usize = 100;
/// A button's label: at most 80 characters.
const MAX_LABEL_CHARS: usize = 80;
/// Buttons per action row, and action rows per message.
const PER_ROW: usize = 5;
const MAX_ROWS: usize = 5;

/// The sending half of the Discord adapter.
pub struct DiscordOutbound {
    rest: Rest,
    channels: Arc<ChannelKinds>,
}

impl DiscordOutbound {
    pub(crate) fn new(rest: Rest, channels: Arc<ChannelKinds>) -> Self {
        Self { rest, channels }
    }

    /// Replace a slash command's deferred response with `body`; `None` when Discord no
    /// longer knows it (then the part goes out as a message). A failure worth
    /// retrying gives the response back for the next attempt (an edit is idempotent).
    async fn answer_interaction(
        &self,
        channel: ChannelId,
        deferred: &super::slash::Deferred,
        body: &serde_json::Value,
    ) -> Option<Result<(), SendError>> {
        let mut edit = body.clone();
        if let Some(fields) = edit.as_object_mut() {
            fields.remove("nonce");
            fields.remove("enforce_nonce");
        }
        let response = match super::slash::answer(&self.rest, deferred, &edit).await {
            Ok(response) => response,
            Err(e) => {
                self.rest.deferrals.put_back(channel, deferred.clone());
                return Some(Err(SendError::Transient(e)));
            }
        };
        let status = response.status().as_u16();
        match classify_status(status) {
            None => Some(Ok(())),
            Some(SendError::Permanent(_)) => {
                tracing::debug!(
                    interaction = deferred.interaction,
                    status,
                    "a slash command's response can no longer be edited; answering with a message"
                );
                None
            }
            Some(error) => {
                self.rest.deferrals.put_back(channel, deferred.clone());
                Some(Err(error))
            }
        }
    }

    fn channel(&self, conversation: &ConversationRef) -> Result<ChannelId, SendError> {
        channel_of(&conversation.key).ok_or_else(|| {
            SendError::Permanent(format!(
                "'{}' is not a Discord channel id",
                conversation.key
            ))
        })
    }
}

/// The nonce of one part: the same for every attempt at that part, different for
/// every other part. It starts with the outbox id and part index (hex); the rest is a
/// hash of the conversation and the message replied to, so a database started afresh
/// (outbox ids counting from 1 again) does not reuse a nonce of a minute ago.
pub(super) fn nonce(
    outbox_id: OutboxId,
    index: usize,
    conversation: &str,
    reply_to: Option<&str>,
) -> String {
    let mut nonce = format!("{:x}.{:x}.", outbox_id.0, index);
    let salt = fnv1a(&[
        conversation.as_bytes(),
        b"/",
        reply_to.unwrap_or("").as_bytes(),
    ]);
    let room = MAX_NONCE_CHARS.saturating_sub(nonce.len());
    nonce.extend(format!("{salt:016x}").chars().take(room));
    nonce.truncate(MAX_NONCE_CHARS);
    nonce
}

/// The `components` of a message offering `replies`: action rows (type 1) of
/// secondary buttons (type 2, style 2) whose `custom_id` is exactly the reply's text,
/// so a click sends what typing it would. Replies with an empty or too long text get
/// no button, and at most 25 fit; `None` when no button is left.
pub(super) fn components(replies: &[QuickReply]) -> Option<serde_json::Value> {
    let buttons: Vec<serde_json::Value> = replies
        .iter()
        .filter(|r| (1..=MAX_CUSTOM_ID_CHARS).contains(&r.text.chars().count()))
        .take(PER_ROW * MAX_ROWS)
        .map(|r| {
            let label: String = r.label.chars().take(MAX_LABEL_CHARS).collect();
            json!({"type": 2, "style": 2, "label": label, "custom_id": r.text})
        })
        .collect();
    if buttons.is_empty() {
        return None;
    }
    let rows: Vec<serde_json::Value> = buttons
        .chunks(PER_ROW)
        .map(|row| json!({"type": 1, "components": row}))
        .collect();
    Some(serde_json::Value::Array(rows))
}

/// FNV-1a, 64 bits: stable across Rust releases and processes (unlike `std`'s
/// hasher), which a nonce must be.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for byte in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[async_trait]
impl Outbound for DiscordOutbound {
    fn platform(&self) -> Platform {
        Platform::Discord
    }

    fn split(&self, text: &str) -> Vec<String> {
        // Discord renders Markdown itself: parts break between paragraphs, lines or
        // words, and a code block cut in two is closed and reopened.
        lull_port::split::split_message(text, MAX_MESSAGE_CHARS)
    }

    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError> {
        let channel = self.channel(part.conversation)?;
        let mut body = json!({
            "content": part.text,
            "nonce": nonce(part.outbox_id, part.index, &part.conversation.key, part.reply_to),
            "enforce_nonce": true,
            // Nobody is pinged by a reply: no @everyone, roles or users, whatever the
            // model wrote.
            "allowed_mentions": { "parse": [] },
        });
        if let Some(components) = components(part.quick_replies) {
            body["components"] = components;
        }
        // The answer to a slash command replaces its "thinking…".
        let answers = (part.index == 0)
            .then(|| {
                let notice = part.kind == lull_port::OutboxKind::Notice;
                self.rest.deferrals.take(channel, part.reply_to, notice)
            })
            .flatten();
        // When Discord no longer knows it: an ordinary message.
        if let Some(deferred) = answers
            && let Some(result) = self.answer_interaction(channel, &deferred, &body).await
        {
            return result;
        }
        // A tapped button (`interaction:<id>`) is no message to quote.
        if let (0, Some(reply_to)) = (part.index, part.reply_to)
            && reply_to.parse::<u64>().is_ok()
            && self.channels.in_guild(&self.rest, channel).await
        {
            // In a busy channel, show which message is answered; if it was deleted
            // meanwhile, send anyway.
            body["message_reference"] = json!({
                "message_id": reply_to,
                "channel_id": channel.to_string(),
                "fail_if_not_exists": false,
            });
        }
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| SendError::Permanent(format!("cannot encode the message: {e}")))?;
        let request = Request::new(
            Route::ChannelMessages {
                channel_id: channel,
            },
            LightMethod::Post,
        )
        .body(Some(bytes));
        let response = self
            .rest
            .request(request)
            .map_err(SendError::Permanent)?
            .send()
            .await
            .map_err(|e| {
                SendError::Transient(format!(
                    "Discord unreachable: {}",
                    self.rest.redactor.redact(e.without_url())
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let header_wait = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| lull_port::retry::parse_retry_after(v, std::time::SystemTime::now()))
            .map(|wait| wait.as_secs_f64());
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let message = self
            .rest
            .redactor
            .redact(body["message"].as_str().unwrap_or(""));
        let error = classify(
            status.as_u16(),
            body["retry_after"].as_f64().or(header_wait),
            &message,
        );
        tracing::debug!(conversation = %part.conversation, outbox = %part.outbox_id, part = part.index, status = status.as_u16(), %error, "Discord did not take a message");
        Err(error)
    }

    /// An image attachment, from its CDN URL (the reference is `<id> <url>`). The CDN
    /// needs no bot token, so none is sent.
    async fn fetch_media(&self, media: &Media, max_bytes: u64) -> Result<MediaBytes, MediaError> {
        let url = media
            .reference
            .split_once(' ')
            .map_or(media.reference.as_str(), |(_, url)| url);
        if let Some(size) = media.size.filter(|&s| s > max_bytes) {
            return Err(MediaError::TooBig {
                size,
                max: max_bytes,
            });
        }
        let download = |url: String| async move {
            crate::media::download(
                &self.rest.client,
                &url,
                max_bytes,
                media.mime.as_deref(),
                &self.rest.redactor,
            )
            .await
        };
        match download(url.to_owned()).await {
            // Expired (Discord signs attachment URLs for about a day): signed again once.
            Err(MediaError::Gone(why)) => match self.rest.refresh_attachment_url(url).await {
                Some(fresh) if fresh != url => {
                    tracing::debug!("an attachment URL had expired; fetching it freshly signed");
                    download(fresh).await
                }
                _ => Err(MediaError::Gone(why)),
            },
            fetched => fetched,
        }
    }

    async fn typing(&self, conversation: &ConversationRef) -> Result<(), SendError> {
        let channel = self.channel(conversation)?;
        self.rest
            .http
            .broadcast_typing(channel)
            .await
            .map_err(|e| from_serenity(&e, &self.rest.redactor))
    }

    fn typing_every(&self) -> Option<Duration> {
        Some(TYPING_EVERY)
    }

    fn reactions(&self) -> bool {
        true
    }

    /// The bot's own reaction, put or deleted. A tapped button or a slash command
    /// (`interaction:<id>`) is no message: there is nothing to react to.
    async fn react(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
        emoji: &str,
        on: bool,
    ) -> Result<(), SendError> {
        let channel = self.channel(conversation)?;
        let Some(message) = message_id.parse::<u64>().ok().filter(|&m| m != 0) else {
            return Ok(());
        };
        let message = serenity::all::MessageId::new(message);
        let reaction = serenity::all::ReactionType::Unicode(emoji.to_owned());
        let http = &self.rest.http;
        let result = if on {
            http.create_reaction(channel, message, &reaction).await
        } else {
            http.delete_reaction_me(channel, message, &reaction).await
        };
        result.map_err(|e| from_serenity(&e, &self.rest.redactor))
    }
}

/// A failed request as far as retrying is concerned: 429 waits as long as Discord
/// asks; server errors and timeouts are worth retrying; 403 (no access to the
/// channel, blocked DMs), 404 (channel gone) and other refusals are not. A 401 is
/// retried: the owner can fix the token, and the replies then go out.
fn classify(status: u16, retry_after: Option<f64>, message: &str) -> SendError {
    let what = if message.is_empty() {
        format!("Discord answered HTTP {status}")
    } else {
        format!("Discord answered HTTP {status}: {message}")
    };
    match status {
        429 => SendError::RetryAfter(Duration::from_secs_f64(
            retry_after
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or(1.0),
        )),
        401 => SendError::Transient(format!("{what} (is DISCORD_BOT_TOKEN right?)")),
        408 | 500..=599 => SendError::Transient(what),
        _ => SendError::Permanent(what),
    }
}

/// A response status as a retry decision (`None`: it went through).
fn classify_status(status: u16) -> Option<SendError> {
    (!(200..300).contains(&status)).then(|| classify(status, None, ""))
}

/// An error from a serenity REST call, classified the same way.
pub(crate) fn from_serenity(error: &serenity::Error, redactor: &super::Redactor) -> SendError {
    use serenity::http::HttpError;
    match error {
        serenity::Error::Http(HttpError::UnsuccessfulRequest(response)) => classify(
            response.status_code.as_u16(),
            None,
            &redactor.redact(&response.error.message),
        ),
        serenity::Error::Http(HttpError::Request(e)) => SendError::Transient(format!(
            "Discord unreachable: {}",
            redactor.redact(reqwest_without_url(e))
        )),
        other => SendError::Transient(redactor.redact(other)),
    }
}

fn reqwest_without_url(e: &reqwest::Error) -> String {
    // `without_url` consumes the error; rebuild the text without the URL instead.
    let text = e.to_string();
    match e.url() {
        Some(url) => text.replace(url.as_str(), "<url>"),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_stable_short_and_distinct() {
        let a = nonce(OutboxId(7), 0, "77", Some("1001"));
        assert_eq!(a, nonce(OutboxId(7), 0, "77", Some("1001")));
        assert!(a.starts_with("7.0."), "{a}");
        assert_eq!(a.len(), "7.0.".len() + 16);
        assert_ne!(a, nonce(OutboxId(7), 1, "77", Some("1001")));
        assert_ne!(a, nonce(OutboxId(8), 0, "77", Some("1001")));
        // A fresh database reusing outbox id 7 for another message.
        assert_ne!(a, nonce(OutboxId(7), 0, "77", Some("2002")));
        let huge = nonce(OutboxId(i64::MAX), 4095, "77", None);
        assert!(huge.len() <= MAX_NONCE_CHARS, "{huge}");
    }

    #[test]
    fn statuses_map_to_retry_decisions() {
        assert_eq!(
            classify(429, Some(2.5), ""),
            SendError::RetryAfter(Duration::from_millis(2500))
        );
        assert_eq!(
            classify(429, None, ""),
            SendError::RetryAfter(Duration::from_secs(1))
        );
        assert!(matches!(classify(500, None, ""), SendError::Transient(_)));
        assert!(matches!(classify(502, None, ""), SendError::Transient(_)));
        assert!(matches!(classify(401, None, ""), SendError::Transient(_)));
        assert!(
            matches!(classify(403, None, "Missing Access"), SendError::Permanent(m) if m.contains("Missing Access"))
        );
        assert!(matches!(classify(404, None, ""), SendError::Permanent(_)));
        assert!(matches!(classify(400, None, ""), SendError::Permanent(_)));
    }

    #[test]
    fn quick_replies_are_buttons_in_rows_of_five() {
        let reply = |label: &str, text: &str| QuickReply {
            label: label.into(),
            text: text.into(),
        };
        assert!(components(&[]).is_none());
        let long = format!("/approve {}", "9".repeat(100));
        assert_eq!(
            components(&[
                reply("Approve", "/approve 12"),
                reply("Too long", &long),
                reply("Cancel", "/cancel 12"),
            ]),
            Some(json!([{"type": 1, "components": [
                {"type": 2, "style": 2, "label": "Approve", "custom_id": "/approve 12"},
                {"type": 2, "style": 2, "label": "Cancel", "custom_id": "/cancel 12"},
            ]}]))
        );
        let many: Vec<QuickReply> = (0..30)
            .map(|i| reply("A", &format!("/approve {i}")))
            .collect();
        let rows = components(&many).unwrap();
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 5);
        assert!(
            rows.iter()
                .all(|r| r["components"].as_array().unwrap().len() == 5)
        );
    }

    #[test]
    fn replies_split_at_discords_limit() {
        let text = "lorem ipsum dolor sit amet ".repeat(167);
        let parts = lull_port::split::split_message(text.trim_end(), MAX_MESSAGE_CHARS);
        assert_eq!(parts.len(), 3);
    }
}
