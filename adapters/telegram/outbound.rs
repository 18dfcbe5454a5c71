//! Sending replies to Telegram.
//!
//! Telegram facts this relies on:
//! - A message holds at most 4096 characters after entity parsing; replies are split
//!   on the Markdown (so a code block cut in two is closed and reopened) and each
//!   part converted to HTML, which only ever shortens the visible text.
//! - HTML that Telegram cannot parse fails the whole request with 400 "can't parse
//!   entities"; the part is then sent again as plain text, so a formatting slip
//!   never loses a reply.
//! - `reply_parameters.allow_sending_without_reply` sends even if the quoted message
//!   was deleted (and a 400 "message to be replied not found" is retried without the
//!   quote, for servers that ignore the flag).
//! - 429 carries `parameters.retry_after`; 403 means the bot was blocked or removed;
//!   400 "chat not found" means it never will be delivered. teloxide waits 10 s after
//!   a 5xx before reporting it (Telegram's own advice).
//! - The "typing…" indicator lasts 5 s or until the bot sends a message.
//! - `sendMessageDraft` (Bot API 9.5) shows a draft in a private chat: an animated
//!   preview of a message being written (updates with the same `draft_id` animate),
//!   1–4096 characters after entity parsing, lasting about 30 s. It is not a message:
//!   the reply is still sent with `sendMessage`. Groups get 400. teloxide 0.17 does not
//!   know the method; it is sent as a payload of our own through teloxide's JSON
//!   request, on the same client, API URL, error mapping and token redaction. A Bot
//!   API server that does not know it answers 404 "Not Found": drafts then stay off
//!   in this process.
//! - A part with quick replies carries them as an inline keyboard (`reply_markup`),
//!   one callback button per reply whose `callback_data` is the reply's text. The Bot
//!   API takes 1–64 bytes of `callback_data`: a reply that does not fit gets no button
//!   (the text still says how to answer). A tap arrives as a `callback_query` update
//!   (see `translate`).
//! - `setMessageReaction` sets the bot's reaction on a message (a bot sets at most one;
//!   an empty list takes it off). Only emoji of Telegram's reaction list are accepted
//!   (👀 is one, ✅ is not: so the ack reaction is taken off, not replaced); a chat
//!   whose admins restricted reactions answers 400 "REACTION_INVALID".
//!
//! There is no idempotency key in the Bot API: a part sent just before a crash, and
//! not yet marked sent, is sent again on recovery. The core marks each part
//! right after Telegram accepts it, which keeps that window to one request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use teloxide::payloads::{SendChatActionSetters, SendMessageSetters, SetMessageReactionSetters};
use teloxide::requests::{JsonRequest, Payload, Request, Requester};
use teloxide::types::{
    ChatAction, ChatId, FileId, InlineKeyboardButton, InlineKeyboardMarkup, MessageId, ParseMode,
    ReactionType, ReplyParameters, ThreadId, True,
};
use teloxide::{ApiError, Bot, RequestError};

use super::html::markdown_to_html;
use super::{ChatKey, MAX_MESSAGE_CHARS, Redactor, request_error};
use lull_port::domain::{ConversationRef, DraftId, Platform};
use lull_port::{Media, MediaBytes, MediaError, Outbound, OutgoingPart, QuickReply, SendError};

/// The most bytes of `callback_data` a button may carry (Bot API: 1–64 bytes).
pub(super) const MAX_CALLBACK_DATA_BYTES: usize = 64;
/// Buttons per keyboard row: an answer and its alternative side by side.
const BUTTONS_PER_ROW: usize = 2;

/// What a draft shows before the first words: Telegram shows a placeholder for an
/// empty text only in newer Bot API versions, and refuses it in others.
const PLACEHOLDER: &str = "…";

/// The sending half: any process may send for any Telegram conversation (sending is
/// not limited to the poller).
pub struct TelegramOutbound {
    /// Never printed: its `Debug` shows the token.
    bot: Bot,
    redactor: Redactor,
    /// Cleared when the Bot API server does not know `sendMessageDraft`.
    drafts: AtomicBool,
}

/// `sendMessageDraft`, which teloxide 0.17 lacks: sent as a [`JsonRequest`] like
/// teloxide's own payloads.
#[derive(Debug, Clone, Serialize)]
struct SendMessageDraft {
    chat_id: i64,
    draft_id: u32,
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_thread_id: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_mode: Option<ParseMode>,
}

impl Payload for SendMessageDraft {
    type Output = True;
    const NAME: &'static str = "SendMessageDraft";
}

impl TelegramOutbound {
    pub(super) fn new(bot: Bot, redactor: Redactor) -> Self {
        Self {
            bot,
            redactor,
            drafts: AtomicBool::new(true),
        }
    }

    /// One sendMessageDraft request.
    async fn send_draft(
        &self,
        key: ChatKey,
        draft: DraftId,
        text: String,
        html: bool,
    ) -> Result<(), RequestError> {
        let payload = SendMessageDraft {
            chat_id: key.chat,
            draft_id: draft.get(),
            text,
            message_thread_id: key.topic,
            parse_mode: html.then_some(ParseMode::Html),
        };
        JsonRequest::new(self.bot.clone(), payload)
            .send()
            .await
            .map(|_| ())
    }

    fn key(conversation: &ConversationRef) -> Result<ChatKey, SendError> {
        ChatKey::parse(&conversation.key).ok_or_else(|| {
            SendError::Permanent(format!(
                "'{}' is not a Telegram conversation key",
                conversation.key
            ))
        })
    }

    /// One sendMessage request, with the buttons of `keyboard` under it if any.
    async fn send_message(
        &self,
        key: ChatKey,
        text: String,
        html: bool,
        quote: Option<MessageId>,
        keyboard: Option<&InlineKeyboardMarkup>,
    ) -> Result<(), RequestError> {
        let mut request = self.bot.send_message(ChatId(key.chat), text);
        if let Some(keyboard) = keyboard {
            request = request.reply_markup(keyboard.clone());
        }
        if html {
            request = request.parse_mode(ParseMode::Html);
        }
        if let Some(topic) = key.topic {
            request = request.message_thread_id(ThreadId(MessageId(topic)));
        }
        if let Some(message_id) = quote {
            request = request.reply_parameters(ReplyParameters {
                message_id,
                allow_sending_without_reply: Some(true),
                ..ReplyParameters::default()
            });
        }
        request.send().await.map(|_| ())
    }

    /// A Bot API error as a retry decision, with the token redacted.
    fn classify(&self, error: RequestError) -> SendError {
        match error {
            RequestError::RetryAfter(wait) => SendError::RetryAfter(wait.duration()),
            RequestError::MigrateToChatId(to) => SendError::Permanent(format!(
                "the group was upgraded to a supergroup (new chat id {}); its old conversation cannot be answered",
                to.0
            )),
            RequestError::Api(ApiError::Unknown(description)) => classify_description(&description),
            RequestError::Api(api) => {
                SendError::Permanent(format!("Telegram refused the message: {api}"))
            }
            e @ (RequestError::Network(_)
            | RequestError::InvalidJson { .. }
            | RequestError::Io(_)) => SendError::Transient(request_error(&self.redactor, e)),
        }
    }
}

/// An error description teloxide does not know: 4xx texts start with their status
/// name ("Bad Request: …", "Forbidden: …"); anything else (a 5xx, a proxy's text) is
/// worth retrying. A 429 without parameters still names its wait.
fn classify_description(description: &str) -> SendError {
    if let Some(rest) = description.strip_prefix("Too Many Requests: retry after ")
        && let Ok(secs) = rest.trim().parse::<u64>()
    {
        return SendError::RetryAfter(Duration::from_secs(secs));
    }
    let permanent = ["Bad Request", "Forbidden", "Unauthorized", "Not Found"];
    if permanent.iter().any(|p| description.starts_with(p)) {
        SendError::Permanent(format!("Telegram refused the message: {description}"))
    } else {
        SendError::Transient(format!("Telegram failed: {description}"))
    }
}

/// The inline keyboard for `replies`: one callback button per reply, whose
/// `callback_data` is exactly the reply's text, so a tap sends what typing it would.
/// Replies whose text is empty or over [`MAX_CALLBACK_DATA_BYTES`] get no button
/// (Telegram would refuse the whole message); `None` when no button is left.
pub(super) fn keyboard(replies: &[QuickReply]) -> Option<InlineKeyboardMarkup> {
    let buttons: Vec<InlineKeyboardButton> = replies
        .iter()
        .filter(|r| {
            let fits = (1..=MAX_CALLBACK_DATA_BYTES).contains(&r.text.len());
            if !fits {
                tracing::debug!(
                    bytes = r.text.len(),
                    "a quick reply too long for Telegram's callback_data; no button for it"
                );
            }
            fits
        })
        .map(|r| InlineKeyboardButton::callback(r.label.clone(), r.text.clone()))
        .collect();
    if buttons.is_empty() {
        return None;
    }
    Some(InlineKeyboardMarkup::new(
        buttons.chunks(BUTTONS_PER_ROW).map(<[_]>::to_vec),
    ))
}

/// Split to Telegram's limit. Telegram counts text in UTF-16 code units, so a part
/// full of characters outside the Basic Multilingual Plane (emoji) is split again
/// at half the limit. Deterministic, as delivery resumes by part index.
pub(super) fn split_for_telegram(text: &str) -> Vec<String> {
    lull_port::split::split_message(text, MAX_MESSAGE_CHARS)
        .into_iter()
        .flat_map(|part| {
            if part.encode_utf16().count() <= MAX_MESSAGE_CHARS {
                vec![part]
            } else {
                lull_port::split::split_message(&part, MAX_MESSAGE_CHARS / 2)
            }
        })
        .collect()
}

#[async_trait]
impl Outbound for TelegramOutbound {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }

    fn split(&self, text: &str) -> Vec<String> {
        split_for_telegram(text)
    }

    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError> {
        let key = Self::key(part.conversation)?;
        // In groups the first part quotes the last message of the batch, so readers
        // see what is being answered; private chats need no quote.
        let quote = part
            .reply_to
            .filter(|_| key.is_group() && part.index == 0)
            .and_then(|id| id.parse().ok())
            .map(MessageId);
        let keyboard = keyboard(part.quick_replies);
        let keyboard = keyboard.as_ref();
        let html = markdown_to_html(part.text);
        let result = match self.send_message(key, html, true, quote, keyboard).await {
            Err(RequestError::Api(ApiError::CantParseEntities(reason))) => {
                tracing::warn!(conversation = %part.conversation, reason = %self.redactor.redact(&reason), "Telegram refused the HTML; sending the part as plain text");
                self.send_message(key, part.text.to_owned(), false, quote, keyboard)
                    .await
            }
            other => other,
        };
        let result = match result {
            Err(RequestError::Api(ApiError::MessageToReplyNotFound)) => {
                tracing::debug!(conversation = %part.conversation, "the quoted message is gone; sending without the quote");
                self.send_message(key, markdown_to_html(part.text), true, None, keyboard)
                    .await
            }
            other => other,
        };
        result.map_err(|e| self.classify(e))
    }

    /// A photo or image file by its `file_id`: `getFile` names its path, then the
    /// bytes come from `/file/bot<token>/<path>` (the token is in that URL, so no
    /// error carries the URL, and what remains is redacted). The Bot API serves files
    /// of at most 20 MB; `file_size` is checked before the download.
    async fn fetch_media(&self, media: &Media, max_bytes: u64) -> Result<MediaBytes, MediaError> {
        if let Some(size) = media.size.filter(|&s| s > max_bytes) {
            return Err(MediaError::TooBig {
                size,
                max: max_bytes,
            });
        }
        let file = self
            .bot
            .get_file(FileId(media.reference.clone()))
            .send()
            .await
            .map_err(|e| match self.classify(e) {
                SendError::Permanent(why) => MediaError::Gone(why),
                other => MediaError::Transient(other.to_string()),
            })?;
        if u64::from(file.size) > max_bytes {
            return Err(MediaError::TooBig {
                size: u64::from(file.size),
                max: max_bytes,
            });
        }
        let url = self
            .bot
            .api_url()
            .join(&format!("file/bot{}/{}", self.bot.token(), file.path))
            .map_err(|e| MediaError::Gone(format!("bad file path: {e}")))?;
        crate::media::download(
            self.bot.client(),
            url.as_str(),
            max_bytes,
            media.mime.as_deref(),
            &self.redactor,
        )
        .await
    }

    async fn typing(&self, conversation: &ConversationRef) -> Result<(), SendError> {
        let key = Self::key(conversation)?;
        let mut request = self
            .bot
            .send_chat_action(ChatId(key.chat), ChatAction::Typing);
        if let Some(topic) = key.topic {
            request = request.message_thread_id(ThreadId(MessageId(topic)));
        }
        request
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    /// Telegram shows "typing…" for 5 s; renewing after 4 s keeps it steady.
    fn typing_every(&self) -> Option<Duration> {
        Some(Duration::from_secs(4))
    }

    fn reactions(&self) -> bool {
        true
    }

    /// `setMessageReaction` with the emoji, or with none to take lull's off. A button
    /// tap (`cb:…`) is no message: there is nothing to react to.
    async fn react(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
        emoji: &str,
        on: bool,
    ) -> Result<(), SendError> {
        let key = Self::key(conversation)?;
        let Ok(message_id) = message_id.parse::<i32>() else {
            return Ok(());
        };
        let reaction = on.then(|| ReactionType::Emoji {
            emoji: emoji.to_owned(),
        });
        self.bot
            .set_message_reaction(ChatId(key.chat), MessageId(message_id))
            .reaction(reaction)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    /// Private chats only (groups refuse drafts).
    fn drafts(&self, conversation: &ConversationRef) -> bool {
        self.drafts.load(Ordering::Relaxed)
            && ChatKey::parse(&conversation.key).is_some_and(|key| !key.is_group())
    }

    /// The part of the text being written (the last of the parts the reply will be
    /// split into, so at most 4096 characters), as the reply's HTML, or plain text if
    /// Telegram refuses the HTML.
    async fn draft(
        &self,
        conversation: &ConversationRef,
        draft: DraftId,
        text: &str,
    ) -> Result<(), SendError> {
        let key = Self::key(conversation)?;
        if key.is_group() {
            return Err(SendError::Permanent(
                "Telegram shows drafts in private chats only".into(),
            ));
        }
        let part = if text.trim().is_empty() {
            PLACEHOLDER.to_owned()
        } else {
            split_for_telegram(text).pop().unwrap_or_default()
        };
        let result = match self
            .send_draft(key, draft, markdown_to_html(&part), true)
            .await
        {
            Err(RequestError::Api(ApiError::CantParseEntities(_))) => {
                self.send_draft(key, draft, part, false).await
            }
            other => other,
        };
        match result {
            // teloxide reads Telegram's "Not Found" (an unknown method; the token
            // works, other calls succeed) as an invalid token.
            Err(RequestError::Api(ApiError::InvalidToken)) => {
                if self.drafts.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        "the Bot API server does not know sendMessageDraft (Bot API 9.5); live drafts are off, \"typing…\" is shown instead"
                    );
                }
                Err(SendError::Permanent(
                    "the Bot API server does not know sendMessageDraft".into(),
                ))
            }
            other => other.map_err(|e| self.classify(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lull_port::split::char_len;

    #[test]
    fn descriptions_map_to_retry_decisions() {
        assert!(matches!(
            classify_description("Bad Request: chat not found"),
            SendError::Permanent(_)
        ));
        assert!(matches!(
            classify_description("Forbidden: bot was blocked by the user"),
            SendError::Permanent(_)
        ));
        assert!(matches!(
            classify_description("Internal Server Error"),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify_description("Bad Gateway"),
            SendError::Transient(_)
        ));
        assert_eq!(
            classify_description("Too Many Requests: retry after 7"),
            SendError::RetryAfter(Duration::from_secs(7))
        );
    }

    #[test]
    fn a_draft_is_a_bot_api_payload() {
        let draft = SendMessageDraft {
            chat_id: 42,
            draft_id: 7,
            text: "<b>hi</b>".into(),
            message_thread_id: None,
            parse_mode: Some(ParseMode::Html),
        };
        assert_eq!(
            serde_json::to_value(&draft).unwrap(),
            serde_json::json!({"chat_id": 42, "draft_id": 7, "text": "<b>hi</b>", "parse_mode": "HTML"})
        );
        assert_eq!(<SendMessageDraft as Payload>::NAME, "SendMessageDraft");
    }

    #[test]
    fn quick_replies_are_callback_buttons_that_fit() {
        let reply = |label: &str, text: &str| QuickReply {
            label: label.into(),
            text: text.into(),
        };
        assert!(keyboard(&[]).is_none());
        let long = format!("/approve {}", "9".repeat(60));
        let markup = keyboard(&[
            reply("Approve", "/approve 12"),
            reply("Cancel", "/cancel 12"),
            reply("Too long", &long),
            reply("Empty", ""),
        ])
        .unwrap();
        assert_eq!(
            serde_json::to_value(&markup).unwrap(),
            serde_json::json!({"inline_keyboard": [[
                {"text": "Approve", "callback_data": "/approve 12"},
                {"text": "Cancel", "callback_data": "/cancel 12"},
            ]]})
        );
        assert!(keyboard(&[reply("Too long", &long)]).is_none());
    }

    #[test]
    fn parts_fit_telegram_in_characters_and_utf16_units() {
        let text = "word ".repeat(1200); // 6000 characters
        let parts = split_for_telegram(&text);
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| char_len(p) <= MAX_MESSAGE_CHARS));
        let emoji = "🦀".repeat(4000); // 4000 characters, 8000 UTF-16 units
        let parts = split_for_telegram(&emoji);
        assert!(
            parts
                .iter()
                .all(|p| p.encode_utf16().count() <= MAX_MESSAGE_CHARS),
            "{}",
            parts.len()
        );
        assert_eq!(parts.concat(), emoji);
    }
}
