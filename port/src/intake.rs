//! What an adapter hands the core: each inbound update, translated, through the
//! [`Intake`] port; and what the core answers. An adapter acknowledges an update to
//! its platform only once [`Intake::ingest`] returned `Ok`: from then on the update
//! cannot be lost.

use async_trait::async_trait;

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

/// A command a user can send on any platform. Commands bypass the debounce: they are
/// answered at once, without the model, and never join a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `/start`: the greeting platforms send when a user opens the bot.
    Start,
    /// `/help`: what the bot does and how to use it.
    Help,
    /// `/reset`: start a fresh context for this conversation (in a group: admins only).
    Reset,
    /// `/usage`: tokens used today and the limits (an admin: of the group, or of a
    /// user named after the command).
    Usage,
    /// `/allow <platform:user_id>` or `/allow chat [platform:chat_id]` (admins).
    Allow,
    /// `/deny <platform:user_id>` or `/deny chat [platform:chat_id]` (admins).
    Deny,
    /// `/new`: the same as `/reset` (the name users of other bots know).
    New,
    /// `/model [NAME | N]`: list the models, or pick one for this conversation (in a
    /// group: admins only).
    Model,
    /// `/persona [NAME | N | default]`: list the personas, or pick one.
    Persona,
    /// `/prompt TEXT` or `/prompt clear`: this conversation's own system prompt (admins).
    Prompt,
    /// `/stop`: drop the reply being written and close the pending messages unanswered.
    Stop,
    /// `/retry`: answer the last batch again.
    Retry,
    /// `/status`: the model, persona, what is pending, today's usage, the ids.
    Status,
    /// Any other `/word`: answered with the help, never sent to the model. Not
    /// `/approve` and `/cancel`: those answer a question about a tool call and are
    /// stored as messages, so a round decides them under the conversation's lease.
    Unknown,
}

/// Who may use a command ([`Command::who`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// Everyone lull answers.
    Anyone,
    /// In a group, lull's admins (`LULL_ADMINS`); in a private chat, its person.
    AdminsInGroups,
    /// Lull's admins everywhere, and the person at `lull chat` (who runs lull).
    Admins,
}

impl Command {
    /// Parse a message text as a command. Adapters strip platform decorations first
    /// (Telegram's `/cmd@botname`, a leading mention); anything after the command
    /// word is ignored.
    ///
    /// A command word is `/` and a name of ASCII letters, digits and `_` (optionally
    /// `@botname`); anything else (`/usr/bin`, `/ shrug`) is a message.
    pub fn parse(text: &str) -> Option<Command> {
        let word = text.split_whitespace().next()?;
        let name = word.strip_prefix('/')?;
        let name = name.split_once('@').map_or(name, |(name, _)| name);
        let is_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_name {
            return None;
        }
        match name.to_ascii_lowercase().as_str() {
            "start" => Some(Command::Start),
            "help" => Some(Command::Help),
            "reset" => Some(Command::Reset),
            "new" => Some(Command::New),
            "usage" => Some(Command::Usage),
            "allow" => Some(Command::Allow),
            "deny" => Some(Command::Deny),
            "model" => Some(Command::Model),
            "persona" => Some(Command::Persona),
            "prompt" => Some(Command::Prompt),
            "stop" => Some(Command::Stop),
            "retry" => Some(Command::Retry),
            "status" => Some(Command::Status),
            "approve" | "cancel" => None,
            _ => Some(Command::Unknown),
        }
    }

    /// Who may use the command, decided here once for every adapter: a command is
    /// answered the same way on Telegram, Discord, the http adapter and `lull chat`.
    /// `has_argument`: words follow the command (`/model NAME` picks, `/model` lists).
    pub fn who(self, has_argument: bool) -> Who {
        match self {
            Command::Start
            | Command::Help
            | Command::Usage
            | Command::Status
            | Command::Unknown => Who::Anyone,
            Command::Model | Command::Persona if !has_argument => Who::Anyone,
            Command::Reset
            | Command::New
            | Command::Model
            | Command::Persona
            | Command::Stop
            | Command::Retry => Who::AdminsInGroups,
            // A system prompt steers every answer; access decisions admit people.
            Command::Prompt | Command::Allow | Command::Deny => Who::Admins,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Start => "start",
            Command::Help => "help",
            Command::Reset => "reset",
            Command::Usage => "usage",
            Command::Allow => "allow",
            Command::Deny => "deny",
            Command::New => "new",
            Command::Model => "model",
            Command::Persona => "persona",
            Command::Prompt => "prompt",
            Command::Stop => "stop",
            Command::Retry => "retry",
            Command::Status => "status",
            Command::Unknown => "unknown",
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_case_insensitively_with_arguments() {
        assert_eq!(Command::parse("/help"), Some(Command::Help));
        assert_eq!(Command::parse("  /RESET now"), Some(Command::Reset));
        assert_eq!(Command::parse("/start"), Some(Command::Start));
        assert_eq!(Command::parse("/usage"), Some(Command::Usage));
        assert_eq!(Command::parse("/allow telegram:1"), Some(Command::Allow));
        assert_eq!(Command::parse("/deny chat"), Some(Command::Deny));
        assert_eq!(Command::parse("/unknown"), Some(Command::Unknown));
        assert_eq!(Command::parse("/model gpt"), Some(Command::Model));
        assert_eq!(Command::parse("/stop"), Some(Command::Stop));
        assert_eq!(Command::parse("/models"), Some(Command::Unknown));
        assert_eq!(Command::parse("/new"), Some(Command::New));
        assert_eq!(Command::parse("/help@lull_bot"), Some(Command::Help));
        // Answers to a tool's approval question are messages, decided by a round.
        assert_eq!(Command::parse("/approve 3"), None);
        assert_eq!(Command::parse("/cancel 3"), None);
        // Not command words: a path, a lone slash, an emoticon.
        assert_eq!(Command::parse("/usr/bin is a folder"), None);
        assert_eq!(Command::parse("/ shrug"), None);
        assert_eq!(Command::parse("/_/"), None);
        assert_eq!(Command::parse("help"), None);
        assert_eq!(Command::parse(""), None);
        assert_eq!(Command::parse("what does /help do?"), None);
    }
}
