//! The settings area of the contract: a conversation's own choices (its model, its
//! persona, its own system prompt) and `/stop`.

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, HolderId, Timestamp, Version};
use crate::store::StoreError;

/// A conversation's own choices; `None`: the deployment's default. Every process reads
/// them from the database, so a change is seen by all at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConversationSettings {
    /// `/model NAME`.
    pub model: Option<String>,
    /// `/persona NAME`.
    pub persona: Option<String>,
    /// `/prompt TEXT`: this conversation's own system prompt.
    pub prompt: Option<String>,
}

/// How long a command's claim ([`SettingStore::claim_command`]) is kept: longer than
/// any platform redelivers an update.
pub const COMMAND_CLAIM_DAYS: i64 = 7;

/// One of a conversation's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Model,
    Persona,
    Prompt,
}

impl Setting {
    /// Its column in `conversation_settings` (a fixed name, never user input).
    pub(crate) fn column(self) -> &'static str {
        match self {
            Setting::Model => "model",
            Setting::Persona => "persona",
            Setting::Prompt => "prompt",
        }
    }
}

/// What a change of a setting did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingOutcome {
    /// Stored; the conversation moved to `version` (a generation in flight is stale).
    Changed {
        conversation: ConversationId,
        version: Version,
    },
    /// The setting already had that value: nothing was written (a pick applied twice
    /// is applied once).
    Unchanged,
}

/// What `/stop` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub conversation: ConversationId,
    /// The version the conversation moved to: every generation collected before it is
    /// stale.
    pub version: Version,
    /// The platform message ids of the pending messages closed without a reply (their
    /// ack reactions are taken off).
    pub closed: Vec<String>,
    /// The first closed message's row: the batch the closed messages' actions are
    /// keyed by ([`BatchOf`](crate::store::BatchOf)); `None` when nothing was pending.
    pub batch: Option<i64>,
}

/// What `/retry` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The last reply's messages are pending again at `version`, its timer due now.
    Retried {
        conversation: ConversationId,
        version: Version,
        messages: u64,
    },
    /// No reply since the context began: nothing to answer again.
    Nothing,
    /// Messages already wait for an answer, or the last reply is still being sent.
    Busy,
}

/// One setting of `conversation` set to `value` (`None`: cleared)
/// ([`SettingStore::change_setting`]). `is_group` describes the conversation should
/// this be its first write.
#[derive(Debug, Clone, Copy)]
pub struct SettingChange<'a> {
    pub conversation: &'a ConversationRef,
    pub is_group: bool,
    pub setting: Setting,
    pub value: Option<&'a str>,
    pub now: Timestamp,
}

/// `/stop` of `conversation` ([`SettingStore::stop_conversation`]).
#[derive(Debug, Clone, Copy)]
pub struct Stop<'a> {
    pub conversation: &'a ConversationRef,
    pub is_group: bool,
    pub now: Timestamp,
}

/// `/retry` of `conversation`, taken by the process `holder`: the timer is armed due
/// now for it ([`SettingStore::retry_last_reply`]).
#[derive(Debug, Clone, Copy)]
pub struct RetryRequest<'a> {
    pub conversation: &'a ConversationRef,
    pub is_group: bool,
    pub holder: &'a HolderId,
    pub now: Timestamp,
}

/// The claim of the command message `message_id` in `conversation`
/// ([`SettingStore::claim_command`]).
#[derive(Debug, Clone, Copy)]
pub struct CommandClaim<'a> {
    pub conversation: &'a ConversationRef,
    pub message_id: &'a str,
    pub now: Timestamp,
}

/// A fresh context for `conversation` if it has been quiet for `idle` at `now`
/// ([`SettingStore::forget_if_idle`]).
#[derive(Debug, Clone, Copy)]
pub struct IdleForget<'a> {
    pub conversation: &'a ConversationRef,
    pub idle: std::time::Duration,
    pub now: Timestamp,
}

/// Settings: a conversation's own choices, and `/stop`. Both move the conversation's
/// version like a new message, in the transaction that writes them, so the final check
/// of a generation in flight (on any process) finds it stale: a reply is never
/// committed from settings older than the ones in force, nor after a `/stop`. A round
/// reads the settings after it read its `v0`, so what it reads is at least as new as
/// its `v0`.
#[async_trait]
pub trait SettingStore: Send + Sync + 'static {
    /// The conversation's own choices (all `None` for a conversation never seen).
    async fn conversation_settings(
        &self,
        conversation: &ConversationRef,
    ) -> Result<ConversationSettings, StoreError>;

    /// Set (`Some`) or clear (`None`) one setting, in one transaction: unless it already
    /// has that value, store it and bump the version (a conversation with nothing
    /// pending stays settled: its `answered_version` moves along).
    async fn change_setting(&self, change: SettingChange<'_>)
    -> Result<SettingOutcome, StoreError>;

    /// `/stop`, in one transaction: every pending message is closed without a reply
    /// (it takes the new version, which is also the `answered_version`, so even a
    /// commit the cap forces covers none of them), the timer is deleted, and the
    /// version bumped (a generation in flight is stale).
    async fn stop_conversation(&self, stop: Stop<'_>) -> Result<Stopped, StoreError>;

    /// `/retry`, in one transaction: the last reply since the context began, once
    /// delivered, stops covering its messages (its `reply_covers` rows go, so it leaves
    /// the history and no message is covered by two replies; the platform message
    /// stays), and they are pending again: they take a new version and the timer is
    /// armed due now for `holder` (not before a limit's hold ends).
    async fn retry_last_reply(&self, retry: RetryRequest<'_>) -> Result<RetryOutcome, StoreError>;

    /// Claim a command message (`message_id` in `conversation`) before acting on it: `true`
    /// for the first caller only, across every process on the database, so a command
    /// redelivered by its platform (a webhook retried after a slow answer, an update
    /// fetched again after a crash) acts once — a late `/stop` never closes the messages
    /// sent after it, a late `/retry` never answers twice. A claim is kept for
    /// [`COMMAND_CLAIM_DAYS`] days (claims older than that are deleted by the next one);
    /// a crash after the claim and before the act loses the command, never repeats it.
    async fn claim_command(&self, claim: CommandClaim<'_>) -> Result<bool, StoreError>;

    /// Give back the claim of a command whose act failed (nothing was changed), so its
    /// redelivery acts. Deleting a claim that is not there is no error.
    async fn release_command(
        &self,
        conversation: &ConversationRef,
        message_id: &str,
    ) -> Result<(), StoreError>;

    /// `LULL_IDLE_RESET`: if the conversation's last message arrived at or before
    /// `now - idle`, start a fresh context (as `/reset`: history is hidden, no message
    /// is dropped; pending ones are answered in the fresh context), and forget the group
    /// context kept from before the quiet spell. `true`: it was
    /// reset. A conversation never seen, or already fresh, is left alone.
    async fn forget_if_idle(&self, forget: IdleForget<'_>) -> Result<bool, StoreError>;

    /// Note the chat's name as its platform shows it (for the console), unless it is
    /// already so. Not a setting: it moves no version, so no reply is dropped for it.
    async fn note_chat_title(
        &self,
        conversation: ConversationId,
        title: &str,
    ) -> Result<(), StoreError>;
}
