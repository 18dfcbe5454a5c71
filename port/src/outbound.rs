//! What the core asks of an adapter: deliver one part of a reply or notice, show
//! "typing…", show a live draft of a reply being written. Retries, backoff, pacing and
//! dead-lettering are the core's; an adapter makes one attempt and says how it went.

use std::time::Duration;

use async_trait::async_trait;

use crate::domain::{ConversationRef, DraftId, OutboxId, OutboxKind, Platform, Timestamp};
use crate::media::{Media, MediaBytes, MediaError};

/// One part of an outbox row, ready to send. Parts are numbered so a delivery
/// interrupted by a crash resumes at the first unsent part.
#[derive(Debug, Clone)]
pub struct OutgoingPart<'a> {
    pub conversation: &'a ConversationRef,
    /// Stable across retries: webhooks get it as `reply_id`, Discord derives its nonce
    /// from it and `index`.
    pub outbox_id: OutboxId,
    /// When the outbox row was committed, on this process's timeline. Names no row:
    /// with several hosts it moves between reads by their clock offset (use
    /// `stored_at`).
    pub created_at: Timestamp,
    /// When the outbox row was committed, exactly as the database stored it (on the
    /// database's timeline), never translated: the same on every attempt, from every
    /// process. With `outbox_id` it names the row across retries and processes, and
    /// not again in another database whose ids start again at 1 (a webhook's
    /// `webhook-id` is made of both).
    pub stored_at: Timestamp,
    pub kind: OutboxKind,
    pub index: usize,
    pub count: usize,
    pub text: &'a str,
    /// The platform message id to quote (the last message of the batch), if any.
    pub reply_to: Option<&'a str>,
    /// Platform message ids the reply covers (empty for notices).
    pub covers: &'a [String],
    /// Answers the user may send with one tap, shown as buttons under this part
    /// (empty for most parts). Only an offer: the text itself says how to answer,
    /// so an adapter that cannot show buttons ignores them.
    pub quick_replies: &'a [QuickReply],
}

/// A reply the user may send with one tap (a button under a message).
///
/// The invariant every adapter keeps: a quick reply, when tapped, arrives at the
/// core as a *new message* from the user who tapped it, whose text is exactly
/// [`QuickReply::text`]. It takes the same path as typing that text (stored,
/// deduplicated by its message id, access checked by its user, answered by a round),
/// so a button grants nothing that typing would not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickReply {
    /// What the button shows ("Approve").
    pub label: String,
    /// The message a tap sends ("/approve 12").
    pub text: String,
}

impl QuickReply {
    /// The commands a quick reply may send, each followed by a space and a number:
    /// the answers to an approval question (`/approve 12`, `/cancel 12`), and the
    /// pick of a listed model or persona (`/model 2`, `/persona 1`).
    pub const COMMANDS: [&'static str; 4] = ["/approve", "/cancel", "/model", "/persona"];

    /// Whether `text` is a quick reply lull could have offered (one of
    /// [`QuickReply::COMMANDS`], a space, digits, nothing else). A platform lets any
    /// client send any button data (a Telegram `callback_data`, a Discord
    /// `custom_id`): adapters take a tap only when it passes this, so a forged tap
    /// can at most say what the user could have typed.
    pub fn could_be(text: &str) -> bool {
        Self::COMMANDS.iter().any(|command| {
            text.strip_prefix(command)
                .and_then(|rest| rest.strip_prefix(' '))
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::QuickReply;

    #[test]
    fn only_approval_answers_and_picks_could_be_quick_replies() {
        for yes in [
            "/approve 12",
            "/cancel 7",
            "/approve 0",
            "/model 2",
            "/persona 1",
        ] {
            assert!(QuickReply::could_be(yes), "{yes}");
        }
        for no in [
            "",
            "/approve",
            "/approve ",
            "/approve 12 now",
            "/approve x",
            "/approve  1",
            "/reset",
            "hello",
            " /cancel 1",
            "/cancelled 1",
            "/model big",
        ] {
            assert!(!QuickReply::could_be(no), "{no}");
        }
    }
}

/// Why a send failed, as far as retrying is concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The platform asked us to wait (HTTP 429 with a retry hint).
    #[error("rate limited; retry after {0:?}")]
    RetryAfter(Duration),
    /// A network error or a server error: worth retrying with backoff.
    #[error("temporary failure: {0}")]
    Transient(String),
    /// The platform refused the message (blocked by the user, chat gone, malformed):
    /// retrying cannot help.
    #[error("refused: {0}")]
    Permanent(String),
}

/// The sending half of an adapter.
#[async_trait]
pub trait Outbound: Send + Sync + 'static {
    fn platform(&self) -> Platform;

    /// Split a text into the parts the platform accepts, in order. Must be
    /// deterministic: delivery resumes by part index after a crash.
    fn split(&self, text: &str) -> Vec<String>;

    /// Send one part. Retries are the caller's job: this makes one attempt, and returns
    /// within the platform's own time limit. The caller may drop the future at any
    /// await (lease lost, shutdown): the part then counts as not sent.
    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError>;

    /// Show "typing…" in a conversation. Best effort.
    async fn typing(&self, conversation: &ConversationRef) -> Result<(), SendError>;

    /// How often to repeat [`Outbound::typing`] while the model works (the platform's
    /// indicator lapses after a while); `None` if the platform has none.
    fn typing_every(&self) -> Option<Duration>;

    /// How long after its commit a reply that keeps failing (errors, timeouts, rate
    /// limits) is given up and dead-lettered. `None`: it is retried until it goes
    /// through or the platform refuses it ([`SendError::Permanent`]).
    fn max_age(&self) -> Option<Duration> {
        None
    }

    /// Whether `conversation` can show a live draft: a preview of a reply while it is
    /// written, which is not a message and leaves nothing in the chat (Telegram's
    /// private chats). Default: no drafts.
    fn drafts(&self, conversation: &ConversationRef) -> bool {
        let _ = conversation;
        false
    }

    /// Show `text` as draft `draft` of `conversation`, replacing what that draft showed.
    /// `text` is the reply so far, in the same Markdown as [`OutgoingPart::text`] and at
    /// most as long as a reply (the adapter renders it as it renders replies, and cuts
    /// it to what one message holds); empty for a placeholder ("thinking…") before the
    /// first words. A draft is never the reply: the reply still comes through
    /// [`Outbound::send`], and a draft whose reply turned out stale is simply replaced
    /// by a newer one. One attempt, best effort: the core paces the calls, slows down
    /// on [`SendError::RetryAfter`] and stops drafting on [`SendError::Permanent`].
    async fn draft(
        &self,
        conversation: &ConversationRef,
        draft: DraftId,
        text: &str,
    ) -> Result<(), SendError> {
        let _ = (conversation, draft, text);
        Err(SendError::Permanent(format!(
            "{} shows no drafts",
            self.platform()
        )))
    }

    /// Whether the platform shows reactions on messages (Telegram, Discord): only then
    /// does the core set an ack reaction and record it in the store. Default: no.
    fn reactions(&self) -> bool {
        false
    }

    /// Put `emoji` as lull's reaction on message `message_id` (a platform message id
    /// as [`crate::Incoming::message_id`] carried it) of `conversation`, or take lull's
    /// reaction `emoji` off it when `on` is false. One attempt, within the platform's
    /// time limit; the core calls it beside its work, never in the way of a reply,
    /// and never retries it. Default: the platform has none ([`SendError::Permanent`]).
    async fn react(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
        emoji: &str,
        on: bool,
    ) -> Result<(), SendError> {
        let _ = (conversation, message_id, emoji, on);
        Err(SendError::Permanent(format!(
            "{} shows no reactions",
            self.platform()
        )))
    }

    /// Fetch the bytes of `media` (a reference this adapter stored with a message), at
    /// most `max_bytes`: the limit is enforced while the body streams in, within the
    /// platform's time limit, and the platform's token never appears in an error.
    /// Called by the core when it generates the reply to the message, not at ingest.
    /// Default: the platform has no media ([`MediaError::Gone`]).
    async fn fetch_media(&self, media: &Media, max_bytes: u64) -> Result<MediaBytes, MediaError> {
        let _ = max_bytes;
        Err(MediaError::Gone(format!(
            "{} keeps no {} files",
            self.platform(),
            media.kind
        )))
    }
}
