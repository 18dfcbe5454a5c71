//! What an adapter hands the core: each inbound update, translated, through the
//! [`Intake`] port; and what the core answers. An adapter acknowledges an update to
//! its platform only once [`Intake::ingest`] returned `Ok`: from then on the update
//! cannot be lost.
//!
//! A command's [`Command`] and [`Who`] are declared in `crate::command` and re-exported
//! here, where they were first, so every import of them keeps working.

use async_trait::async_trait;

pub use crate::command::{Command, Who};
use crate::domain::{ConversationId, ConversationRef, Platform, Timestamp, Version};
use crate::media::Media;

/// What a user sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Text (for media, the caption, which may be empty). Commands are text too.
    Text(String),
    /// A message lull cannot read (sticker, voice, a file without caption). The
    /// string names it for the user ("sticker").
    Unsupported(String),
}

/// Whether an update is a new message or a change to an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncomingKind {
    New,
    Edit,
    /// A group message not addressed to lull, passed on only when the core may want
    /// it: kept as context for the model (`LULL_GROUP_CONTEXT`), never answered, never
    /// a trigger; or, in a Discord thread lull opened (`LULL_DISCORD_AUTO_THREAD`),
    /// a message like any other (no mention is needed there).
    Overheard,
    /// A new message lull moved into a thread it opened for it (Discord,
    /// `LULL_DISCORD_AUTO_THREAD`): stored as [`IncomingKind::New`] in the thread's
    /// conversation, which the core remembers as one of lull's threads, where
    /// messages need no mention.
    OpenedThread,
}

/// One inbound update, translated by an adapter.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub conversation: ConversationRef,
    /// Group chats get author names in the prompt and replies that quote.
    pub is_group: bool,
    /// The platform's user id (what `LULL_ALLOWED_USERS` and `LULL_ADMINS` list).
    pub user_id: String,
    /// The chats this message came from, as `LULL_ALLOWED_CHATS` names them, most
    /// specific first: a Telegram group's chat id; a Discord channel's id, then its
    /// server's (guild) id. Empty for private chats and the http adapter: a private
    /// chat is admitted by its user alone.
    pub chats: Vec<String>,
    /// The user's display name.
    pub author: String,
    /// The chat's name as its platform shows it, when the update carries one: a
    /// Telegram group's title, the person's name for a private chat (`None`: not
    /// known from this update). Shown on the console; never in a prompt.
    pub title: Option<String>,
    /// The platform's message id, unique within the conversation. Redeliveries carry
    /// the same id and are stored once.
    pub message_id: String,
    /// For media, the caption (possibly empty when `media` is not).
    pub content: Content,
    /// Media sent with the message (a photo, an album part, Discord attachments),
    /// as durable platform references; empty for plain text.
    pub media: Vec<Media>,
    pub kind: IncomingKind,
}

/// How an inbound update was handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Stored; a reply will follow after the debounce window.
    Stored {
        conversation: ConversationId,
        version: Version,
    },
    /// Already stored earlier (a redelivery).
    Duplicate,
    /// An edit that changed nothing pending.
    EditIgnored,
    /// A command, answered at once.
    Command(Command),
    /// A message lull cannot read; the user was told.
    Unsupported,
    /// The user is not allowed; they were told once.
    Denied,
    /// An overheard group message: kept as context (or not, when group context is
    /// off or the group is not admitted); nothing follows.
    Overheard,
}

/// Why an inbound update was refused. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    #[error("the message is empty")]
    Empty,
    #[error("the message is too long ({chars} characters; at most {max} are accepted)")]
    TooLong { chars: usize, max: usize },
    #[error("no adapter for platform {0} in this process")]
    UnknownPlatform(Platform),
    /// The database could not store it now (busy, full, failing): the adapter must
    /// not acknowledge it, so the platform (or the client) delivers it again.
    #[error("the message was not stored ({0}); send it again")]
    NotStored(String),
}

impl IngestError {
    /// Whether sending the same update again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, IngestError::NotStored(_))
    }
}

/// A conversation with recent activity and the last message stored for it: where a
/// platform without replay (Discord's gateway) resumes reading history after downtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentConversation {
    pub conversation: ConversationRef,
    pub is_group: bool,
    /// The platform id of the message stored last in this conversation.
    pub last_message_id: String,
}

/// The core's intake, as adapters see it: store an update, and find where to resume
/// reading after downtime. Nothing else of the core is reachable from an adapter.
#[async_trait]
pub trait Intake: Send + Sync + 'static {
    /// Store an update (or answer a command). `Ok` means it is stored for good (or
    /// deliberately not stored: a denied user, an ignored edit): the adapter may
    /// acknowledge it to its platform. The reply comes later, through the adapter's
    /// [`crate::Outbound`].
    async fn ingest(&self, incoming: Incoming) -> Result<Accepted, IngestError>;

    /// Conversations of `platform` whose last stored message arrived at or after
    /// `since`, most recently active first, at most `limit`, each with the platform id
    /// of its last stored message: where an adapter without replay resumes reading.
    async fn recent_conversations(
        &self,
        platform: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RecentConversation>, IngestError>;

    /// `user_id` is typing in `conversation` (Discord's `TYPING_START`): a burst of
    /// theirs still pending waits a little longer for their next message, never past
    /// its cap. Best effort, nothing stored: with nothing of theirs pending it changes
    /// nothing. The default (an intake that does not listen) ignores it.
    async fn typing(
        &self,
        conversation: ConversationRef,
        user_id: String,
    ) -> Result<(), IngestError> {
        let _ = (conversation, user_id);
        Ok(())
    }
}
