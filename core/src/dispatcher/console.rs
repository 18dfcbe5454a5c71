//! The operator's console's changes to a chat: the chat commands' own store operations
//! (`/model`, `/persona`, `/prompt`, `/new`, `/stop`, `/jobs cancel N`, `/allow`,
//! `/deny`), so
//! they obey the same fences (each moves the conversation's version, and a reply being
//! written is dropped at its final check) and every process sees them at once.
//!
//! An approval is answered the way the chat answers it: `/approve ID` (or `/cancel ID`)
//! stored in the chat that asked, as the console's operator
//! ([`CONSOLE_OPERATOR`], an admin), so a round decides it under the conversation's
//! lease like any answer (a yes taken with the call's reservation, fenced by `v0`; a
//! `/cancel` in the same batch wins) and the chat is told what was done.

use super::{Dispatcher, Event, controls};
use crate::access::{AccessRule, CONSOLE_OPERATOR, Subject, SubjectKind};
use crate::domain::ConversationRef;
use crate::store::{
    IngestOutcome, NewMessage, Setting, SettingChange, StoreError, WaitingApproval,
    console_answer_id,
};

/// The most open approvals the console lists (and looks an answered one up among).
const APPROVALS_LISTED: usize = 500;

/// How long a console page waits for the model server's list of models (asked only
/// without `LULL_MODELS`, and kept for a while once answered): a server that hangs
/// must not hang the page.
const MODELS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The name the console's operator writes under in a chat (the model and the
/// history show it).
const OPERATOR_NAME: &str = "the operator (console)";

/// What a console change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleChange {
    /// Stored; `false`: it was already so (nothing moved).
    Done { changed: bool },
    /// Refused, and why (a model or persona not offered): nothing was stored.
    Refused(String),
}

impl Dispatcher {
    /// The models a chat may be given (what `/model` lists: `LULL_MODELS`, or the
    /// server's list), the first the default's; `Err`: why there is none.
    /// A model server that does not list its models within [`MODELS_WAIT`] is told as
    /// the reason: a page waits no longer for it.
    pub async fn console_models(&self) -> Result<Vec<String>, String> {
        match tokio::time::timeout(MODELS_WAIT, controls::offered_models(self)).await {
            Ok(listed) => listed.map(|models| models.as_ref().clone()),
            Err(_) => Err("the model server did not list its models in time".to_owned()),
        }
    }

    /// The deployment's default model (the one a chat that chose none answers with).
    pub fn console_default_model(&self) -> &str {
        &self.settings.controls.default_model
    }

    /// The personas a chat may be given (`LULL_PERSONAS`), by name.
    pub fn console_personas(&self) -> Vec<String> {
        self.settings.controls.personas.keys().cloned().collect()
    }

    /// Set `setting` of `chat` to `value` (`None`: back to the default), as the chat's
    /// command would: a model must be one `/model` offers, a persona one of
    /// `LULL_PERSONAS`.
    pub async fn console_setting(
        &self,
        chat: &ConversationRef,
        is_group: bool,
        setting: Setting,
        value: Option<&str>,
    ) -> Result<ConsoleChange, StoreError> {
        if let Some(value) = value {
            let offered = match setting {
                Setting::Model => match controls::offered_models(self).await {
                    Ok(models) => models.iter().any(|m| m == value),
                    Err(why) => return Ok(ConsoleChange::Refused(why)),
                },
                Setting::Persona => self.settings.controls.personas.contains_key(value),
                Setting::Prompt => !value.trim().is_empty(),
            };
            if !offered {
                return Ok(ConsoleChange::Refused(format!(
                    "{value:?} is not offered here"
                )));
            }
        }
        let change = SettingChange {
            conversation: chat,
            is_group,
            setting,
            value,
            now: self.clock.now(),
        };
        let changed = controls::change_setting(self, change).await?;
        Ok(ConsoleChange::Done { changed })
    }

    /// `/new` for `chat`: its context starts afresh.
    pub async fn console_new(
        &self,
        chat: &ConversationRef,
        is_group: bool,
    ) -> Result<ConsoleChange, StoreError> {
        super::commands::reset(self, chat, is_group, self.clock.now()).await?;
        Ok(ConsoleChange::Done { changed: true })
    }

    /// `/stop` for `chat`: the reply being written is dropped and the messages waiting
    /// for one are closed unanswered; what the chat's command would answer.
    pub async fn console_stop(
        &self,
        chat: &ConversationRef,
        is_group: bool,
    ) -> Result<String, StoreError> {
        let said = controls::stop_chat(self, chat, is_group, self.clock.now()).await?;
        Ok(said.text)
    }

    /// lull's own tools a round offers in a private chat (memory, jobs, the web, as
    /// they are on here), beside the MCP servers' (`Dispatcher::toolbox`).
    pub fn console_own_tools(&self) -> Vec<crate::tools::ToolSpec> {
        super::round::own_tools(self)
    }

    /// The access lists in force (`LULL_ALLOWED_USERS`, `LULL_ALLOWED_CHATS`,
    /// `LULL_ADMINS`: read-only here, they come from the environment).
    pub fn console_access_lists(&self) -> &crate::access::Access {
        &self.settings.access
    }

    /// The limits in force (a person's budgets, the day's time zone).
    pub fn console_limits(&self) -> &crate::limits::Limits {
        &self.settings.limits
    }

    /// `/allow` or `/deny` of the user `id` on `platform`, decided by the console's
    /// operator; every process follows it at its next read of the decisions.
    pub async fn console_user_access(
        &self,
        platform: crate::domain::Platform,
        id: &str,
        allowed: bool,
    ) -> Result<ConsoleChange, StoreError> {
        if id.is_empty() || id == "*" {
            return Ok(ConsoleChange::Refused(
                "name one user, as platform:id".to_owned(),
            ));
        }
        let rule = AccessRule {
            subject: Subject {
                platform,
                kind: SubjectKind::User,
                id: id.to_owned(),
            },
            allowed,
            set_by: "console".into(),
            set_at: self.clock.now(),
        };
        super::commands::decide_access(self, &rule).await?;
        Ok(ConsoleChange::Done { changed: true })
    }

    /// `/jobs cancel N` of `chat`: what the chat's command would answer (the job
    /// cancelled, or no such active job there).
    pub async fn console_cancel_job(
        &self,
        chat: &ConversationRef,
        id: i64,
    ) -> Result<String, StoreError> {
        super::job_commands::cancel(self.store.as_ref(), chat, id, self.clock.now()).await
    }

    /// The memories of `scope`, newest first (what `/memory` lists there).
    pub async fn console_memories(
        &self,
        scope: &crate::store::Scope,
    ) -> Result<Vec<crate::store::Memory>, StoreError> {
        self.store
            .memories(
                std::slice::from_ref(scope),
                crate::store::MEMORIES_PER_SCOPE,
            )
            .await
    }

    /// `/memory forget N` in `scope`: what the chat's command would answer.
    pub async fn console_forget_memory(
        &self,
        scope: &crate::store::Scope,
        id: i64,
    ) -> Result<String, StoreError> {
        super::memory::forget_in(self, scope, id).await
    }

    /// `/memory clear` of `scope` (its rounds in flight fenced): what the chat's
    /// command would answer.
    pub async fn console_clear_memories(
        &self,
        scope: &crate::store::Scope,
    ) -> Result<String, StoreError> {
        super::memory::clear_in(self, scope).await
    }

    /// `/allow chat` or `/deny chat` for `chat`, decided by the console's operator.
    pub async fn console_access(
        &self,
        chat: &ConversationRef,
        allowed: bool,
    ) -> Result<ConsoleChange, StoreError> {
        let rule = AccessRule {
            subject: Subject {
                platform: chat.platform,
                kind: SubjectKind::Chat,
                id: chat.key.clone(),
            },
            allowed,
            set_by: "console".into(),
            set_at: self.clock.now(),
        };
        super::commands::decide_access(self, &rule).await?;
        Ok(ConsoleChange::Done { changed: true })
    }
}

impl Dispatcher {
    /// Every chat's approvals waiting for an answer, oldest first (at most
    /// [`APPROVALS_LISTED`]).
    pub async fn console_approvals(&self) -> Result<Vec<WaitingApproval>, StoreError> {
        self.store
            .waiting_approvals(self.clock.now(), APPROVALS_LISTED)
            .await
    }

    /// Answer the approval `id` from the console: `/approve ID` (`approve`) or
    /// `/cancel ID` stored in its chat as the console's operator, decided there by the
    /// next round (see the module doc). The same answer posted again is the same
    /// message, stored once: a second click does nothing. What the console shows.
    pub async fn console_answer_approval(
        &self,
        id: i64,
        approve: bool,
    ) -> Result<String, StoreError> {
        let waiting = self.console_approvals().await?;
        let Some(found) = waiting.into_iter().find(|w| w.action.id == id) else {
            return Ok(format!(
                "No approval #{id} is waiting: it was answered, it expired, or it was never asked."
            ));
        };
        let (word, said) = if approve {
            ("approve", "Approved")
        } else {
            ("cancel", "Cancelled")
        };
        let message = NewMessage {
            conversation: found.conversation.clone(),
            is_group: found.is_group,
            message_id: console_answer_id(id, approve),
            user_id: CONSOLE_OPERATOR.to_owned(),
            author: OPERATOR_NAME.to_owned(),
            text: format!("/{word} {id}"),
            media: Vec::new(),
        };
        let now = self.clock.now();
        match self.store.ingest(message, &self.holder, now).await? {
            IngestOutcome::Stored {
                conversation,
                version,
                due_at,
            } => {
                tracing::info!(%conversation, action = id, approve, "an approval answered from the console");
                self.emit(Event::Ingested {
                    conversation,
                    version,
                });
                self.wake_by(due_at);
                Ok(format!(
                    "{said} #{id} ({}) in {}: the chat's next round decides it once and tells the chat.",
                    found.action.tool, found.conversation
                ))
            }
            IngestOutcome::Duplicate { .. } | IngestOutcome::EditIgnored => Ok(format!(
                "#{id} was already answered so from the console: nothing more is done."
            )),
        }
    }
}
